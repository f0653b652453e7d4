// Llama parity with PyTorch: models/llama-tiny.pbtxt built at the size of tests/ref/llama_ref.h5
// (made by tests/ref/make_llama_ref.py, float64 PyTorch written as Hugging Face's
// LlamaForCausalLM computes; this test needs no PyTorch), once per kv_heads 1 (multi-query),
// 2 (grouped) and 4 (= heads), run through the real graph executor with the reference's
// parameters and tokens: the logits, the loss and every parameter gradient, in fp32 (relative
// 1e-5) and in bf16 mixed precision.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "gpt_ref.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain {
namespace {

std::vector<float> floats_of(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  kernels::host_to_f32(t.data, t.dtype, v.data(), t.numel());
  return v;
}

struct LlamaTolerance {
  double logits, loss, grads;
};
LlamaTolerance llama_tolerance(DType t) {
  if (t == DType::f32) return {1e-5, 1e-5, 1e-5};
  // bf16: one rounding (2^-8) of each activation and weight, ~30 ops deep, at the reference's
  // large weights (measured: logits 3e-2, gradients 7e-2; a wrong rotary pairing gives 1.3
  // and 1.6, tests/ref/make_llama_ref.py --pairing interleaved)
  return {6e-2, 2e-3, 1.2e-1};
}

class LlamaParity : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(LlamaParity, LogitsLossAndGradients) {
  const auto [kv, compute] = GetParam();
  const LlamaTolerance tol = llama_tolerance(compute);
  const std::string src = RINGTRAIN_SOURCE_DIR;
  gpt_ref::GptRef ref(src + "/tests/ref/llama_ref.h5");
  ASSERT_GE(ref.file, 0) << "cannot open tests/ref/llama_ref.h5";
  const std::string g = "kv" + std::to_string(kv) + "/";
  const int64_t v = ref.iattr("vocab_size"), vp = ref.iattr("padded_vocab_size");
  const int64_t t = ref.iattr("seq_len"), b = ref.iattr("batch");
  const std::vector<std::pair<std::string, std::string>> vars = {
      {"layers", std::to_string(ref.iattr("n_layer"))},
      {"heads", std::to_string(ref.iattr("n_head"))},
      {"kv_heads", std::to_string(kv)},
      {"width", std::to_string(ref.iattr("n_embd"))},
      {"ffn", std::to_string(ref.iattr("ffn"))},
      {"context", std::to_string(t)},
      {"padded_vocab", std::to_string(vp)},
      {"rope_theta", std::to_string(ref.attr("rope_theta"))},
      {"norm_eps", "1e-5"}};
  auto backend = kernels::make_cpu_backend(1);
  kernels::Backend& be = *backend;
  auto model = build_model(src + "/models/llama-tiny.pbtxt", {t}, v, vars, compute);
  size_t count = 0;
  for (Param& p : model->params()) {
    Shape s;
    const auto w = ref.real(g + "params/" + p.name, &s);
    ASSERT_EQ(s, p.shape) << p.name;
    for (size_t i = 0; i < w.size(); ++i) p.master.as<float>()[i] = float(w[i]);
    ++count;
  }
  EXPECT_EQ(count, size_t(3 + 9 * ref.iattr("n_layer"))) << "parameters of the model";
  model->refresh_working_copy(be);

  auto tok = ref.read<int32_t>("tokens", H5T_NATIVE_INT32);
  auto tgt = ref.read<int32_t>("targets", H5T_NATIVE_INT32);
  OwnedTensor tokens, targets, dlogits;
  std::copy(tok.begin(), tok.end(), tokens.ensure({b, t}, DType::i32).as<int32_t>());
  std::copy(tgt.begin(), tgt.end(), targets.ensure({b, t}, DType::i32).as<int32_t>());
  Context ctx{be, compute, true, 0};
  const Tensor& logits = model->forward(ctx, tokens.view);
  ASSERT_EQ(logits.shape, (Shape{b, t, vp}));
  const double e_logits = gpt_ref::rel_err(floats_of(logits), ref.real(g + "logits"));
  EXPECT_LE(e_logits, tol.logits) << "logits";
  Tensor& d = dlogits.ensure(logits.shape, DType::f32);
  const double loss = be.token_xent(logits, targets.view, v, 1.f, &d).loss_sum / double(b * t);
  model->backward(ctx, d);
  const double want = ref.real(g + "loss")[0];
  const double e_loss = std::fabs(loss - want) / want;
  EXPECT_LE(e_loss, tol.loss) << "loss " << loss << " vs " << want;
  double e_grads = 0;
  for (Param& p : model->params()) {
    const double e = gpt_ref::rel_err(floats_of(p.grad), ref.real(g + "grads/" + p.name));
    e_grads = std::max(e_grads, e);
    EXPECT_LE(e, tol.grads) << "gradient of " << p.name;
  }
  std::printf("llama parity kv_heads %d %s: logits %.2e, loss %.2e, gradients %.2e\n", kv,
              dtype_name(compute), e_logits, e_loss, e_grads);
}

INSTANTIATE_TEST_SUITE_P(KvHeadsPrecision, LlamaParity,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values(DType::f32, DType::bf16)),
                         [](const auto& info) {
                           return "kv" + std::to_string(std::get<0>(info.param)) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace ringtrain
