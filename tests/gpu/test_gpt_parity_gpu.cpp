// GPT parity with PyTorch on the CUDA backend: the CPU test's reference (tests/ref/gpt_ref.h5,
// tests/unit/test_gpt_parity.cpp) run with the model, its activations and AdamW on cuda:0.
// One pass checks every transformer op together as the model uses them: the embedding
// lookup and the tied head (the embedding's gradient sums both), layer norm, attention,
// GELU, the residual adds, the token cross-entropy over the padded vocabulary, and 10 AdamW
// steps with the model file's decay groups; the same tolerances as on the CPU.
#include <string>
#include <vector>

#include "nn/graph_builder.hpp"
#include "nn/optimizer.hpp"
#include "tests/gpu/gpu_util.hpp"
#include "tests/unit/gpt_ref.hpp"

namespace ringtrain::test {
namespace {

using gpt_ref::GptRef;
using gpt_ref::rel_err;

class GptParityOnGpu : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { RT_NEED_GPU(); }
};

TEST_P(GptParityOnGpu, LogitsLossGradientsAndTenAdamWSteps) {
  const DType compute = GetParam();
  const gpt_ref::Tolerance tol = gpt_ref::tolerance_of(compute);
  const std::string path = source_dir() + "/tests/ref/gpt_ref.h5";
  GptRef ref(path);
  ASSERT_GE(ref.file, 0) << "cannot open " << path << " (gpu_tests --source-dir=REPO)";
  const int64_t v = ref.iattr("vocab_size"), vp = ref.iattr("padded_vocab_size");
  const int64_t t = ref.iattr("seq_len"), b = ref.iattr("batch");
  const std::vector<std::pair<std::string, std::string>> vars = {
      {"layers", std::to_string(ref.iattr("n_layer"))},
      {"heads", std::to_string(ref.iattr("n_head"))},
      {"width", std::to_string(ref.iattr("n_embd"))},
      {"context", std::to_string(t)},
      {"padded_vocab", std::to_string(vp)}};
  kernels::Backend& be = gpu_backend();
  // The reference's parameters into host masters, then uploaded to the device model.
  auto host = build_model("gpt-tiny", {t}, v, vars, compute);
  for (Param& p : host->params()) {
    Shape s;
    const auto w = ref.real("params/" + p.name, &s);
    ASSERT_EQ(s, p.shape) << p.name;
    for (size_t i = 0; i < w.size(); ++i) p.master.as<float>()[i] = float(w[i]);
  }
  DeviceScope scope(gpu());
  auto model = build_model("gpt-tiny", {t}, v, vars, compute);
  copy_bytes(model->master().data, gpu(), host->master().data, Device{}, model->master().bytes());
  model->refresh_working_copy(be);

  auto tok = ref.read<int32_t>("tokens", H5T_NATIVE_INT32);
  auto tgt = ref.read<int32_t>("targets", H5T_NATIVE_INT32);
  OwnedTensor tokens, targets, dlogits, grad32;
  copy_bytes(tokens.ensure({b, t}, DType::i32, gpu()).data, gpu(), tok.data(), Device{},
             tok.size() * 4);
  copy_bytes(targets.ensure({b, t}, DType::i32, gpu()).data, gpu(), tgt.data(), Device{},
             tgt.size() * 4);
  Context ctx{be, compute, true, 0};
  gpt_ref::Tolerance worst{0, 0, 0, 0};
  auto loss_and_backward = [&](bool check) {
    const Tensor& logits = model->forward(ctx, tokens.view);
    EXPECT_EQ(logits.shape, (Shape{b, t, vp}));
    EXPECT_EQ(logits.dtype, DType::f32) << "the last node's output is fp32";
    if (check) {
      worst.logits = rel_err(floats(logits), ref.real("logits"));
      EXPECT_LE(worst.logits, tol.logits) << dtype_name(compute) << " logits";
    }
    Tensor& d = dlogits.ensure(logits.shape, DType::f32, gpu());
    const double loss = be.token_xent(logits, targets.view, v, 1.f, &d).loss_sum / double(b * t);
    model->backward(ctx, d);
    return loss;
  };
  const double loss = loss_and_backward(true);
  const double want_loss = ref.real("loss")[0];
  worst.loss = std::fabs(loss - want_loss) / want_loss;
  EXPECT_LE(worst.loss, tol.loss) << dtype_name(compute) << " loss " << loss << " vs " << want_loss;
  std::vector<DecayRange> ranges;
  for (Param& p : model->params()) {
    const double e = rel_err(floats(p.grad), ref.real("grads/" + p.name));
    worst.grads = std::max(worst.grads, e);
    EXPECT_LE(e, tol.grads) << dtype_name(compute) << " gradient of " << p.name;
    EXPECT_EQ(p.decay, ref.decay(p.name)) << "default weight decay of " << p.name;
    ranges.push_back({p.offset, p.master.numel(), p.decay});
  }

  OptimizerConfig oc;
  oc.name = "adamw";
  oc.lr = float(ref.attr("lr"));
  oc.beta1 = float(ref.attr("beta1"));
  oc.beta2 = float(ref.attr("beta2"));
  oc.eps = float(ref.attr("eps"));
  oc.weight_decay = float(ref.attr("weight_decay"));
  auto opt = make_optimizer(oc, model->num_params());
  opt->set_decay_ranges(ranges);
  const auto want_losses = ref.real("losses");
  Tensor work = model->work();
  for (size_t k = 0; k < want_losses.size(); ++k) {
    const double l = k == 0 ? loss : loss_and_backward(false);
    worst.losses = std::max(worst.losses, std::fabs(l - want_losses[k]) / want_losses[k]);
    EXPECT_LE(std::fabs(l - want_losses[k]) / want_losses[k], tol.losses)
        << dtype_name(compute) << " loss before step " << k << ": " << l << " vs "
        << want_losses[k];
    Tensor g = model->grad();
    if (compute != DType::f32) {
      g = grad32.ensure({model->num_params()}, DType::f32, gpu());
      be.cast(model->grad(), g);
    }
    opt->step(be, model->master(), g, compute == DType::f32 ? nullptr : &work, oc.lr);
  }
  std::printf(
      "gpt parity on cuda %s: logits %.2e, loss %.2e, gradients %.2e, 10 AdamW losses %.2e\n",
      dtype_name(compute), worst.logits, worst.loss, worst.grads, worst.losses);
}

INSTANTIATE_TEST_SUITE_P(Precision, GptParityOnGpu,
                         ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace ringtrain::test
