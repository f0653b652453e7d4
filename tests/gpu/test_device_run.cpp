// The pieces `ringtrain train --device cuda` adds around the model (launch/device.hpp and
// core's device handling): a model built under a DeviceScope has device-labelled flat views,
// Model::init_parameters gives it the host's values through staging, HostMirror copies the
// masters, buffers and optimizer state to the host and back, and BatchStage uploads a batch.
#include "launch/device.hpp"
#include "nn/graph_builder.hpp"
#include "nn/optimizer.hpp"
#include "tests/gpu/gpu_util.hpp"

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

TEST(DeviceRun, BatchStageUploads) {
  RT_NEED_GPU();
  OwnedTensor x, y;
  Tensor& xh = x.ensure({2, 3}, DType::f32, Device{});
  Tensor& yh = y.ensure({2}, DType::i32, Device{});
  for (int i = 0; i < 6; ++i) xh.as<float>()[i] = float(i);
  yh.as<int32_t>()[0] = 1;
  yh.as<int32_t>()[1] = 0;
  io::Batch host{xh, yh, 4, 128};
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

}  // namespace
}  // namespace ringtrain::test
