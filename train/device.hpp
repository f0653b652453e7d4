// What `--device cuda` changes in `ringtrain train` and `ringtrain eval`, in one place: the
// rank's GPU (local rank -> device), the backend under --gpu-memory, the communicator of
// the gradients (NCCL, or MPI staged through host memory), the start-up GPU line and the
// precision warnings, the batch upload, and host copies of the model's and optimizer's
// flat buffers for checkpoints and histograms. On --device cpu each function returns the
// CPU's own (the CPU backend, the world communicator, the host views): the training loop
// has one path for both devices.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "io/checkpoint.hpp"
#include "io/loader.hpp"
#include "kernels/kernels.hpp"
#include "nn/model.hpp"
#include "nn/optimizer.hpp"
#include "train/config.hpp"

namespace ringtrain::launch {

// "cpu" or "cuda:N".
std::string device_str(Device d);

// The run's device for --device `name`: cpu, or this rank's GPU, chosen from its local rank
// by kernels::cuda::device_for_local_rank (the one visible GPU under launch/ringrun, else the
// local rank modulo the visible GPUs). Input error naming --device 'cuda' when the node has
// none.
Device choose_device(const std::string& name, const comm::Communicator& comm);

// The backend of `device`: the CPU backend on `threads`, or the CUDA backend of the GPU with
// the allocator policy of --gpu-memory (the first call on a device fixes its policy).
std::unique_ptr<kernels::Backend> make_backend(Device device, int threads,
                                               const std::string& gpu_memory);

// The communicator `ringtrain train` runs on, or null for `world` itself (cpu with --comm
// mpi). cpu: hierarchical over MPI. cuda: nccl, hierarchical over NCCL, or mpi staged
// through host memory (no CUDA-aware MPI assumed). Collective; runs its phases under
// run_and_agree() (the device and its allocator first, so that every rank has its GPU before NCCL
// starts).
std::unique_ptr<comm::Communicator> make_train_communicator(const TrainConfig& cfg,
                                                            comm::Communicator& world);

// The start-up line of each node's GPU (printed by the node's local rank 0) and the
// warning for a precision the GPU lacks tensor cores for (fp16 below compute capability
// 7.0, bf16 below 8.0). Nothing on cpu.
void announce_device(Device device, DType precision, const comm::Communicator& comm);

// The loader's host batch on the run's device: x and labels copied into device buffers
// kept between steps. On cpu, the host batch itself.
class BatchStage {
 public:
  const io::Batch& operator()(const io::Batch& host, Device device);

 private:
  OwnedTensor x_, y_;
  io::Batch batch_;
};

// Host copies of a model's flat masters and buffers and an optimizer's state (for a GPU
// run's checkpoints), with the checkpoint's named views into them: the same names, shapes
// and offsets as master_views / buffer_views / Trainer::optimizer_views of the device
// buffers.
class HostMirror {
 public:
  HostMirror(Model& model, const Optimizer* opt);  // opt may be null (eval)
  // The same for any views of device buffers, e.g. --zero 1's shards (Trainer::param_views
  // and optimizer_views): one host copy per view, with its name, full shape and offset.
  HostMirror(const std::vector<io::NamedTensor>& params,
             const std::vector<io::OptimizerState>& optimizer,
             const std::vector<io::NamedTensor>& buffers);
  void download();  // device -> host (before a save)
  void upload();    // host -> device (after a load); refresh the working copy afterwards
  std::vector<io::NamedTensor> params, buffers;
  std::vector<io::OptimizerState> optimizer;

 private:
  // A host buffer of t's size, copied to and from t; returns the host tensor.
  Tensor mirror(const Tensor& t);
  struct Copy {
    Tensor device, host;
  };
  std::vector<Copy> copies_;
  std::vector<Buffer> storage_;
};

// An fp32 tensor's values readable on the host: its own memory on cpu, else a copy in
// `staging` (for histograms).
const float* host_floats(const Tensor& t, std::vector<float>& staging);

}  // namespace ringtrain::launch
