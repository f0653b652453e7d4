// The pieces `ringtrain train --device cuda` adds around the model (train/device.hpp and
// core's device handling): a model built under a DeviceScope has device-labelled flat views,
// Model::init_parameters gives it the host's values through staging, HostMirror copies the
// masters, buffers and optimizer state to the host and back, BatchStage uploads a batch, and
// the GradReducer's wire-dtype cast is queued on the stream without waiting for it. ZeRO-1's
// device pieces: sharded masters initialised on the device equal the host's, and a
// HostMirror of shard views (full shape, part offset) round-trips them.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>

#include "nn/graph_builder.hpp"
#include "nn/optimizer.hpp"
#include "tests/gpu/gpu_util.hpp"
#include "train/device.hpp"

namespace ringtrain::test {
namespace {

std::unique_ptr<Model> small_resnet(DType precision) {  // BatchNorm buffers and parameters
  return build_model("resnet", {3, 8, 8}, 4, {{"depth", "1"}, {"width", "8"}}, precision);
}

TEST(DeviceRun, InitOnDeviceEqualsHost) {
  RT_NEED_GPU();
  auto host = small_resnet(DType::bf16);
  host->init_parameters(11, cpu_backend());
  DeviceScope scope(gpu());
  auto dev = small_resnet(DType::bf16);
  EXPECT_EQ(dev->device(), gpu());
  EXPECT_EQ(dev->master().device, gpu());
  EXPECT_EQ(dev->grad().device, gpu());
  EXPECT_EQ(dev->state().device, gpu());
  dev->init_parameters(11, gpu_backend());
  EXPECT_EQ(floats(dev->master()), floats(host->master()));
  EXPECT_EQ(floats(dev->state()), floats(host->state()));
  EXPECT_EQ(floats(dev->work()), floats(host->work()));  // the same rounding to bf16
}

TEST(DeviceRun, HostMirrorRoundTrip) {
  RT_NEED_GPU();
  DeviceScope scope(gpu());
  auto model = small_resnet(DType::f32);
  model->init_parameters(3, gpu_backend());
  auto opt = make_optimizer(OptimizerConfig{}, model->num_params());  // adamw: two states
  ASSERT_EQ(opt->state(0).device, gpu());
  launch::HostMirror mirror(*model, opt.get());
  ASSERT_EQ(mirror.params.size(), model->params().size());
  ASSERT_EQ(mirror.optimizer.size(), 2u);
  mirror.download();
  const std::vector<float> m = floats(model->master());
  for (size_t i = 0; i < model->params().size(); ++i) {
    const auto& p = model->params()[i];
    ASSERT_EQ(mirror.params[i].name, p.name);
    ASSERT_EQ(mirror.params[i].tensor.shape, p.shape);
    EXPECT_EQ(mirror.params[i].tensor.as<float>()[0], m[size_t(p.offset)]) << p.name;
  }
  // Change the host copies, upload, and read the device back.
  for (auto& p : mirror.params) p.tensor.as<float>()[0] = 42.f;
  for (auto& b : mirror.buffers) b.tensor.as<float>()[0] = -1.f;
  for (auto& s : mirror.optimizer)
    for (auto& p : s.per_param) p.tensor.as<float>()[0] = 7.f;
  mirror.upload();
  const std::vector<float> m2 = floats(model->master()), s2 = floats(model->state());
  const std::vector<float> o2 = floats(opt->state(1));
  for (const auto& p : model->params()) {
    EXPECT_EQ(m2[size_t(p.offset)], 42.f) << p.name;
    EXPECT_EQ(o2[size_t(p.offset)], 7.f) << p.name;
  }
  for (const auto& b : model->buffers()) EXPECT_EQ(s2[size_t(b.offset)], -1.f) << b.name;
}

// --zero 1 in bf16: rank 1 of 3's shard of the masters, the whole working copy and the fp32
// copy of the parameters read in fp32, drawn on the device as on the host.
TEST(DeviceRun, ShardedInitOnDeviceEqualsHost) {
  RT_NEED_GPU();
  auto host = small_resnet(DType::bf16);
  const int64_t n = host->num_params(), lo = n / 3, hi = 2 * n / 3;
  host->shard_masters(lo, hi);
  host->init_parameters(11, cpu_backend());
  DeviceScope scope(gpu());
  auto dev = small_resnet(DType::bf16);
  dev->shard_masters(lo, hi);
  dev->init_parameters(11, gpu_backend());
  ASSERT_EQ(dev->master().numel(), hi - lo);
  ASSERT_GT(dev->fp32_copy().numel(), 0);
  EXPECT_EQ(dev->fp32_copy().device, gpu());
  EXPECT_EQ(floats(dev->master()), floats(host->master()));
  EXPECT_EQ(floats(dev->work()), floats(host->work()));
  EXPECT_EQ(floats(dev->fp32_copy()), floats(host->fp32_copy()));
  EXPECT_EQ(floats(dev->state()), floats(host->state()));
}

// The mirror of views as Trainer::param_views gives them under --zero 1: each parameter's
// part of a shard, named with its full shape and its offset in it.
TEST(DeviceRun, HostMirrorOfShardViews) {
  RT_NEED_GPU();
  DeviceScope scope(gpu());
  auto model = small_resnet(DType::f32);
  model->init_parameters(3, gpu_backend());
  const int64_t n = model->num_params(), lo = n / 3, hi = 2 * n / 3;
  const Tensor shard = model->master().slice(lo, {hi - lo});
  std::vector<io::NamedTensor> views;
  for (const auto& p : model->params()) {
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + shape_numel(p.shape));
    if (a < b) views.push_back({p.name, shard.slice(a - lo, {b - a}), p.shape, a - p.offset});
  }
  ASSERT_GE(views.size(), 2u);
  launch::HostMirror mirror(views, {}, {});
  ASSERT_EQ(mirror.params.size(), views.size());
  mirror.download();
  const std::vector<float> m = floats(model->master());
  for (size_t i = 0; i < views.size(); ++i) {
    const auto& h = mirror.params[i];
    EXPECT_EQ(h.name, views[i].name);
    EXPECT_EQ(h.full_shape, views[i].full_shape);
    EXPECT_EQ(h.part_offset, views[i].part_offset);
    EXPECT_EQ(h.tensor.device.kind, Device::cpu);
    const int64_t at = lo + (views[i].tensor.as<float>() - shard.as<float>());
    for (int64_t k = 0; k < h.tensor.numel(); ++k)
      ASSERT_EQ(h.tensor.as<float>()[k], m[size_t(at + k)]) << h.name << " element " << k;
  }
  for (auto& p : mirror.params) p.tensor.as<float>()[0] = 42.f;
  mirror.upload();
  const std::vector<float> m2 = floats(model->master());
  for (size_t i = 0; i < views.size(); ++i)
    EXPECT_EQ(m2[size_t(lo + (views[i].tensor.as<float>() - shard.as<float>()))], 42.f)
        << views[i].name;
  EXPECT_EQ(m2[0], m[0]) << "outside the shard";
}

TEST(DeviceRun, BatchStageUploads) {
  RT_NEED_GPU();
  OwnedTensor x, y;
  Tensor& xh = x.ensure({2, 3}, DType::f32, Device{});
  Tensor& yh = y.ensure({2}, DType::i32, Device{});
  for (int i = 0; i < 6; ++i) xh.as<float>()[i] = float(i);
  yh.as<int32_t>()[0] = 1;
  yh.as<int32_t>()[1] = 0;
  io::Batch host{io::DataKind::images, xh, yh, 4, 128};
  launch::BatchStage stage;
  const io::Batch& b = stage(host, gpu());
  EXPECT_EQ(b.x.device, gpu());
  EXPECT_EQ(b.y.device, gpu());
  EXPECT_EQ(b.epoch, 4);
  EXPECT_EQ(b.position, 128);
  EXPECT_EQ(floats(b.x), floats(xh));
  EXPECT_EQ(floats(b.y), floats(yh));
  EXPECT_EQ(&stage(host, Device{}), &host);  // cpu: the host batch itself
}

// The communication thread's cast to the wire dtype (kernels::cuda::queue_cast, the body
// of the Trainer's ReducerConfig::cast) must queue behind the backward work already on the
// compute stream and return at once, so buckets go out while backward runs. The stream is
// held here by a host function that blocks until released; the cast, called from another
// thread, has to come back while it is still held (a cast that synchronised would wait for
// the release, which only comes after 30 s).
TEST(DeviceRun, WireCastQueuesWithoutWaitingForTheStream) {
  RT_NEED_GPU();
  const int64_t n = 4099;
  Pair src = make_pair({n}, DType::f32, uniform(n, -3, 3, 12)), dst = make_pair({n}, DType::bf16);
  auto wire = kernels::cuda::make_cuda_backend(0);
  // Once unblocked first: the cast kernel is then loaded (lazy loading may synchronise).
  kernels::cuda::queue_cast(*wire, 0, src.d(), dst.d());
  kernels::cuda::synchronize(0);
  Pair zero = make_pair({n}, DType::bf16);
  copy_bytes(dst.d().data, gpu(), zero.h().data, Device{}, dst.d().bytes());

  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  } gate;
  auto stream = static_cast<cudaStream_t>(kernels::cuda::compute_stream(0));
  ASSERT_EQ(cudaLaunchHostFunc(
                stream,
                [](void* p) {
                  auto* g = static_cast<Gate*>(p);
                  std::unique_lock<std::mutex> lock(g->mu);
                  g->cv.wait(lock, [g] { return g->open; });
                },
                &gate),
            cudaSuccess);
  auto cast = std::async(std::launch::async,
                         [&] { kernels::cuda::queue_cast(*wire, 0, src.d(), dst.d()); });
  const bool returned = cast.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  {
    std::lock_guard<std::mutex> lock(gate.mu);
    gate.open = true;
  }
  gate.cv.notify_all();
  cast.get();
  EXPECT_TRUE(returned) << "queue_cast waited for the compute stream";
  kernels::cuda::synchronize(0);
  cpu_backend().cast(src.h(), dst.h());
  EXPECT_EQ(floats(dst.d()), floats(dst.h()));  // and it ran, after the held work
}

}  // namespace
}  // namespace ringtrain::test
