// GPT parity with PyTorch, as llm.c's test_gpt2: models/gpt-tiny.pbtxt built at the size of
// tests/ref/gpt_ref.h5 (made by tests/ref/make_gpt_ref.py, float64 PyTorch; this test needs no
// PyTorch), run through the real graph executor with the reference's parameters and tokens:
// the logits, the loss, every parameter gradient (the tied embedding's sums the lookup and
// the head) and the losses of 10 AdamW steps (decay on the Linear weights only, as the model
// file's defaults give), in fp32 and in bf16/fp16 mixed precision.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gpt_ref.hpp"
#include "kernels/kernels.hpp"
#include "nn/graph_builder.hpp"
#include "nn/optimizer.hpp"
#include "test_util.hpp"

namespace ringtrain {
namespace {

using gpt_ref::GptRef;
using gpt_ref::rel_err;
using gpt_ref::Tolerance;
using gpt_ref::tolerance_of;

std::vector<float> floats_of(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  kernels::host_to_f32(t.data, t.dtype, v.data(), t.numel());
  return v;
}

class GptParity : public ::testing::TestWithParam<DType> {};

TEST_P(GptParity, LogitsLossGradientsAndTenAdamWSteps) {
  const DType compute = GetParam();
  const Tolerance tol = tolerance_of(compute);
  GptRef ref(std::string(RINGTRAIN_SOURCE_DIR) + "/tests/ref/gpt_ref.h5");
  ASSERT_GE(ref.file, 0) << "cannot open tests/ref/gpt_ref.h5";
  const int64_t v = ref.iattr("vocab_size"), vp = ref.iattr("padded_vocab_size");
  const int64_t t = ref.iattr("seq_len"), b = ref.iattr("batch");
  auto backend = kernels::make_cpu_backend(1);
  auto model = build_model(std::string(RINGTRAIN_SOURCE_DIR) + "/models/gpt-tiny.pbtxt", {t}, v,
                           {{"layers", std::to_string(ref.iattr("n_layer"))},
                            {"heads", std::to_string(ref.iattr("n_head"))},
                            {"width", std::to_string(ref.iattr("n_embd"))},
                            {"context", std::to_string(t)},
                            {"padded_vocab", std::to_string(vp)}},
                           compute);
  // Every parameter of the reference, once each (the head shares the embedding's).
  std::vector<std::string> names;
  for (Param& p : model->params()) {
    Shape s;
    const auto w = ref.real("params/" + p.name, &s);
    ASSERT_EQ(s, p.shape) << p.name;
    for (size_t i = 0; i < w.size(); ++i) p.master.as<float>()[i] = float(w[i]);
    names.push_back(p.name);
  }
  ASSERT_EQ(names.size(), size_t(4 + 12 * ref.iattr("n_layer"))) << "parameters of the model";
  model->refresh_working_copy(*backend);

  auto tok = ref.read<int32_t>("tokens", H5T_NATIVE_INT32);
  auto tgt = ref.read<int32_t>("targets", H5T_NATIVE_INT32);
  Tensor tokens(tok.data(), {b, t}, DType::i32), targets(tgt.data(), {b, t}, DType::i32);
  Context ctx{*backend, compute, true, 0};
  OwnedTensor dlogits;
  Tolerance worst{0, 0, 0, 0};  // the errors measured, printed for the record
  auto loss_and_backward = [&](bool check) {
    const Tensor& logits = model->forward(ctx, tokens);
    EXPECT_EQ(logits.shape, (Shape{b, t, vp}));
    EXPECT_EQ(logits.dtype, DType::f32) << "the last node's output is fp32";
    if (check) {
      worst.logits = rel_err(floats_of(logits), ref.real("logits"));
      EXPECT_LE(worst.logits, tol.logits) << dtype_name(compute) << " logits";
    }
    Tensor& d = dlogits.ensure(logits.shape, DType::f32);
    const double loss = backend->token_xent(logits, targets, v, 1.f, &d).loss_sum / double(b * t);
    model->backward(ctx, d);
    return loss;
  };
  const double loss = loss_and_backward(true);
  const double want_loss = ref.real("loss")[0];
  worst.loss = std::fabs(loss - want_loss) / want_loss;
  EXPECT_LE(worst.loss, tol.loss) << dtype_name(compute) << " loss " << loss << " vs " << want_loss;
  for (Param& p : model->params()) {
    const double e = rel_err(floats_of(p.grad), ref.real("grads/" + p.name));
    worst.grads = std::max(worst.grads, e);
    EXPECT_LE(e, tol.grads) << dtype_name(compute) << " gradient of " << p.name;
  }

  // AdamW from the same start, decay groups from the parameters (as the Trainer sets them).
  OptimizerConfig oc;
  oc.name = "adamw";
  oc.lr = float(ref.attr("lr"));
  oc.beta1 = float(ref.attr("beta1"));
  oc.beta2 = float(ref.attr("beta2"));
  oc.eps = float(ref.attr("eps"));
  oc.weight_decay = float(ref.attr("weight_decay"));
  auto opt = make_optimizer(oc, model->num_params());
  std::vector<DecayRange> ranges;
  for (const Param& p : model->params()) {
    EXPECT_EQ(p.decay, ref.decay(p.name)) << "default weight decay of " << p.name;
    ranges.push_back({p.offset, p.master.numel(), p.decay});
  }
  opt->set_decay_ranges(ranges);
  const auto want_losses = ref.real("losses");
  OwnedTensor grad32;
  Tensor work = model->work();
  for (size_t k = 0; k < want_losses.size(); ++k) {
    const double l = k == 0 ? loss : loss_and_backward(false);
    worst.losses = std::max(worst.losses, std::fabs(l - want_losses[k]) / want_losses[k]);
    EXPECT_LE(std::fabs(l - want_losses[k]) / want_losses[k], tol.losses)
        << dtype_name(compute) << " loss before step " << k << ": " << l << " vs "
        << want_losses[k];
    Tensor g = model->grad();
    if (compute != DType::f32) {
      g = grad32.ensure({model->num_params()}, DType::f32);
      backend->cast(model->grad(), g);
    }
    opt->step(*backend, model->master(), g, compute == DType::f32 ? nullptr : &work, oc.lr);
  }
  std::printf("gpt parity %s: logits %.2e, loss %.2e, gradients %.2e, 10 AdamW losses %.2e\n",
              dtype_name(compute), worst.logits, worst.loss, worst.grads, worst.losses);
}

INSTANTIATE_TEST_SUITE_P(Precision, GptParity,
                         ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace ringtrain
