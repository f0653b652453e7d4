// The device plumbing of train and eval (see device.hpp). Only plain C++ here: the CUDA
// backend and NCCL are reached through kernels/cuda/cuda_api.hpp and comm/nccl/nccl_api.hpp,
// whose stubs answer "not built" in a build without CUDA.
#include "train/device.hpp"

#include <algorithm>
#include <iostream>

#include "comm/hierarchical.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "comm/nccl/nccl_api.hpp"
#include "core/error.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "train/job.hpp"

namespace ringtrain::launch {

std::string device_str(Device d) {
  return d.kind == Device::cpu ? std::string("cpu") : cat("cuda:", d.index);
}

Device choose_device(const std::string& name, const comm::Communicator& comm) {
  if (name != "cuda") return Device{};
  RT_REQUIRE(kernels::cuda::built(),
             "--device 'cuda': this build of ringtrain has no CUDA backend (configure with "
             "-DRINGTRAIN_CUDA=ON on a machine with nvcc, cuDNN and NCCL); use --device cpu");
  std::string why;
  const int visible = kernels::cuda::device_count(&why);
  RT_REQUIRE(visible > 0, "--device 'cuda': no usable CUDA device on ", hostname(), " (", why,
             "); run on a GPU node or use --device cpu");
  // The GPU launch/ringrun would give this rank (keeping a mapping Slurm made per task with
  // --gpus-per-task/--gpu-bind); the local rank modulo the visible GPUs when that says none.
  const Placement placement = find_placement(comm);
  const int index = placement.device >= 0 && placement.device < visible
                        ? placement.device
                        : kernels::cuda::device_for_local_rank(comm.local_rank());
  return Device{Device::cuda, index};
}

std::unique_ptr<kernels::Backend> make_backend(Device device, int threads,
                                               const std::string& gpu_memory) {
  if (device.kind == Device::cpu) return kernels::make_cpu_backend(threads);
  auto backend = kernels::cuda::make_cuda_backend(device.index,
                                                  kernels::cuda::MemoryPolicy::parse(gpu_memory));
  backend->set_threads(threads);  // host threads: the banner reports them, the GPU ignores them
  return backend;
}

std::unique_ptr<comm::Communicator> make_train_communicator(const TrainConfig& cfg,
                                                            comm::Communicator& world) {
  std::unique_ptr<comm::Communicator> out;
  if (cfg.device != "cuda") {
    // Collective, and its one check (every node holds as many ranks) fails alike on every
    // rank after the collective: not an agreed phase (see train/job.hpp).
    if (cfg.comm == "hierarchical")
      out = std::make_unique<comm::HierarchicalCommunicator>(world.mpi());
    return out;
  }
  // Every rank has its GPU, with the allocator policy of --gpu-memory, before any NCCL call:
  // NCCL's set-up touches the device, which would create its runtime with the default policy.
  Device dev;
  run_and_agree(world, [&] {
    dev = choose_device(cfg.device, world);
    (void)make_backend(dev, 1, cfg.gpu_memory);
  });
  // Collective (NCCL's and MPI's communicator set-up): not an agreed phase; an error here
  // ends the job from the rank that saw it (train/job.hpp).
  {
    if (cfg.comm == "nccl")
      out = comm::make_nccl_communicator(world.mpi(), dev.index);
    else if (cfg.comm == "hierarchical")
      out = comm::make_nccl_hierarchical(world.mpi(), dev.index);
    else  // mpi: device buffers go through host memory around each collective
      out = comm::make_staged_communicator(std::make_unique<comm::MpiCommunicator>(world.mpi()),
                                           dev.index);
  }
  return out;
}

void announce_device(Device device, DType precision, const comm::Communicator& comm) {
  if (device.kind != Device::cuda || comm.local_rank() != 0) return;
  const kernels::cuda::DeviceInfo info = kernels::cuda::device_info(device.index);
  // One write per line: through mpirun, the nodes' lines must not interleave.
  std::cout << cat("gpu: node ", comm.node(), " (", hostname(), ", rank ", comm.rank(), " of ",
                   comm.local_size(), " on the node): ", kernels::cuda::describe(info), "\n")
            << std::flush;
  const std::string warning = kernels::cuda::precision_warning(info, precision);
  if (!warning.empty())
    std::cerr << cat("ringtrain: warning: ", warning, " [node ", comm.node(), ", ", hostname(),
                     "]\n")
              << std::flush;
}

const io::Batch& BatchStage::operator()(const io::Batch& host, Device device) {
  if (device.kind == Device::cpu) return host;
  const Tensor& x = x_.ensure(host.x.shape, host.x.dtype, device);
  const Tensor& y = y_.ensure(host.y.shape, host.y.dtype, device);
  copy_bytes(x.data, device, host.x.data, host.x.device, host.x.bytes());
  copy_bytes(y.data, device, host.y.data, host.y.device, host.y.bytes());
  batch_ = host;
  batch_.x = x;
  batch_.y = y;
  return batch_;
}

Tensor HostMirror::mirror(const Tensor& t) {
  storage_.emplace_back(std::max<size_t>(t.bytes(), 4), Device{});  // (an empty part: 0 bytes)
  const Tensor h(storage_.back().data(), t.shape, t.dtype, Device{});
  copies_.push_back({t, h});
  return h;
}

HostMirror::HostMirror(Model& model, const Optimizer* opt) {
  const Tensor m = mirror(model.master()), s = mirror(model.state());
  for (const auto& p : model.params()) params.push_back({p.name, m.slice(p.offset, p.shape)});
  for (const auto& b : model.buffers()) buffers.push_back({b.name, s.slice(b.offset, b.shape)});
  if (!opt) return;
  for (size_t i = 0; i < opt->state_names().size(); ++i) {
    const Tensor t = mirror(opt->state(i));
    io::OptimizerState st{opt->state_names()[i], {}};
    for (const auto& p : model.params())
      st.per_param.push_back({p.name, t.slice(p.offset, p.shape)});
    optimizer.push_back(std::move(st));
  }
}

HostMirror::HostMirror(const std::vector<io::NamedTensor>& device_params,
                       const std::vector<io::OptimizerState>& device_optimizer,
                       const std::vector<io::NamedTensor>& device_buffers) {
  auto copy_of = [&](const io::NamedTensor& v) {
    io::NamedTensor m(v.name, mirror(v.tensor), v.full_shape, v.part_offset);
    m.split_axis = v.split_axis;
    m.split_ranges = v.split_ranges;
    m.writes = v.writes;
    return m;
  };
  for (const auto& v : device_params) params.push_back(copy_of(v));
  for (const auto& v : device_buffers) buffers.push_back(copy_of(v));
  for (const auto& st : device_optimizer) {
    io::OptimizerState h{st.state, {}};
    for (const auto& v : st.per_param) h.per_param.push_back(copy_of(v));
    optimizer.push_back(std::move(h));
  }
}

void HostMirror::download() {
  for (const Copy& c : copies_)
    copy_bytes(c.host.data, Device{}, c.device.data, c.device.device, c.device.bytes());
}

void HostMirror::upload() {
  for (const Copy& c : copies_)
    copy_bytes(c.device.data, c.device.device, c.host.data, Device{}, c.device.bytes());
}

const float* host_floats(const Tensor& t, std::vector<float>& staging) {
  if (t.device.kind == Device::cpu) return t.as<float>();
  staging.resize(size_t(t.numel()));
  copy_bytes(staging.data(), Device{}, t.data, t.device, t.bytes());
  return staging.data();
}

}  // namespace ringtrain::launch
