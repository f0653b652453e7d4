// Ten training steps of the MLP, the CNN and the ResNet on the GPU against the same steps
// on the CPU backend: same initial masters, batches, dropout seeds and optimizer (SGD with
// momentum, whose update is linear in the gradient, so the runs stay comparable), in fp32,
// fp16 and bf16. The model and its activations live on the device through a DeviceScope;
// the losses and the parameter updates must agree within each precision's tolerance.
#include <cmath>

#include "core/model.hpp"
#include "core/optimizer.hpp"
#include "core/rng.hpp"
#include "tests/gpu/gpu_util.hpp"

namespace ringtrain::test {
namespace {

struct RunResult {
  std::vector<double> losses;
  std::vector<float> init, final_master;
};

RunResult train(const ModelSpec& spec, DType precision, bool on_gpu, int steps, int64_t batch) {
  kernels::Backend& be = on_gpu ? gpu_backend() : cpu_backend();
  const Device dev = on_gpu ? gpu() : Device{};
  // The masters are drawn on the host (init_parameters writes host memory), then copied.
  auto host_model = build_model(spec, precision);
  host_model->init_parameters(7, cpu_backend());
  DeviceScope scope(dev);
  auto model = build_model(spec, precision);
  copy_bytes(model->master().data, dev, host_model->master().data, Device{},
             model->master().bytes());
  if (model->num_buffer_elems() > 0)
    copy_bytes(model->state().data, dev, host_model->state().data, Device{},
               model->state().bytes());
  model->refresh_working_copy(be);
  OptimizerConfig oc;
  oc.name = "sgd";
  oc.lr = 0.05f;
  oc.momentum = 0.9f;
  auto opt = make_optimizer(oc, model->num_params());
  Buffer g32_storage;
  Tensor grad32 = model->grad();
  if (precision != DType::f32) {
    g32_storage = Buffer(size_t(model->num_params()) * 4, dev);
    grad32 = Tensor(g32_storage.data(), {model->num_params()}, DType::f32, dev);
  }
  RunResult r;
  r.init = floats(Tensor(model->master().data, {model->num_params()}, DType::f32, dev));
  const float scale = precision == DType::f32 ? 1.f : 1024.f;
  Shape xs{batch};
  for (int64_t d : spec.input) xs.push_back(d);
  OwnedTensor x32, xc, labels, dl;
  for (int step = 1; step <= steps; ++step) {
    // The batch: host data, uploaded (the Trainer's path).
    Rng rng(1000 + uint64_t(step));
    std::vector<float> xv(static_cast<size_t>(shape_numel(xs))), yv(static_cast<size_t>(batch));
    for (auto& v : xv) v = 2.f * rng.uniform() - 1.f;
    for (auto& v : yv) v = float(rng.below(uint64_t(spec.classes)));
    Tensor& xt = x32.ensure(xs, DType::f32, dev);
    Tensor& yt = labels.ensure({batch}, DType::i32, dev);
    std::vector<int32_t> yi(yv.begin(), yv.end());
    copy_bytes(xt.data, dev, xv.data(), Device{}, xt.bytes());
    copy_bytes(yt.data, dev, yi.data(), Device{}, yt.bytes());
    const Tensor* x = &xt;
    if (precision != DType::f32) {
      be.cast(xt, xc.ensure(xs, precision, dev));
      x = &xc.view;
    }
    Context ctx{be, precision, true, 99 + uint64_t(step)};
    const Tensor& logits = model->forward(ctx, *x);
    Tensor& dlt = dl.ensure(logits.shape, DType::f32, dev);
    const auto xent = be.softmax_xent(logits, yt, scale, &dlt);
    r.losses.push_back(xent.loss_sum / double(batch));
    model->backward(ctx, dlt);
    const bool bad = be.unscale_check(model->grad(), 1.f / scale, grad32);
    EXPECT_FALSE(bad) << "non-finite gradients at step " << step;
    Tensor work = model->work();
    opt->step(be, model->master(), grad32, precision == DType::f32 ? nullptr : &work, oc.lr);
  }
  r.final_master = floats(Tensor(model->master().data, {model->num_params()}, DType::f32, dev));
  return r;
}

class TrainingTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  void SetUp() override { RT_NEED_GPU(); }
};

TEST_P(TrainingTest, TenStepsMatchCpu) {
  const auto [name, precision] = GetParam();
  ModelSpec spec;
  spec.name = name;
  spec.classes = 4;
  if (name == "mlp") {
    spec.input = {1, 8, 8};
    spec.hidden = {64, 32};
  } else if (name == "cnn") {
    spec.input = {1, 12, 12};
  } else {
    spec.input = {3, 8, 8};
    spec.depth = 1;
    spec.width = 8;
  }
  RunResult cpu, gpu;
  try {
    cpu = train(spec, precision, false, 10, 16);
  } catch (const Error& e) {  // the reference must run: its failure is the test's
    FAIL() << "the CPU reference run of " << name << " " << dtype_name(precision)
           << " failed: " << e.what();
  }
  gpu = train(spec, precision, true, 10, 16);
  const double loss_tol = precision == DType::f32 ? 1e-4 : 3e-2;
  for (size_t s = 0; s < cpu.losses.size(); ++s)
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], loss_tol * std::fabs(cpu.losses[s]))
        << "loss of step " << s + 1;
  // The parameter updates (final - initial) agree relative to their size.
  std::vector<float> du_gpu(cpu.init.size()), du_cpu(cpu.init.size());
  for (size_t i = 0; i < du_cpu.size(); ++i) {
    du_cpu[i] = cpu.final_master[i] - cpu.init[i];
    du_gpu[i] = gpu.final_master[i] - gpu.init[i];
  }
  EXPECT_EQ(cpu.init, gpu.init);
  const double upd_tol = precision == DType::f32 ? 1e-3 : 8e-2;
  EXPECT_TRUE(all_close(du_gpu, du_cpu, 0, upd_tol * max_abs(du_cpu)));
}

INSTANTIATE_TEST_SUITE_P(Models, TrainingTest,
                         ::testing::Combine(::testing::Values("mlp", "cnn", "resnet"),
                                            ::testing::Values(DType::f32, DType::f16, DType::bf16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace ringtrain::test
