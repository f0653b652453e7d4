// GPT parity with PyTorch on the CUDA backend: the CPU test's reference (tests/ref/gpt_ref.h5,
// tests/unit/test_gpt_parity.cpp) run with the model, its activations and AdamW on cuda:0.
// One pass checks every transformer op together as the model uses them: the embedding
// lookup and the tied head (the embedding's gradient sums both), layer norm, attention,
// GELU, the residual adds, the token cross-entropy over the padded vocabulary, and 10 AdamW
// steps with the model file's decay groups; the same tolerances as on the CPU.
#include <cstdio>
#include <string>

#include "tests/gpu/gpu_util.hpp"
#include "tests/unit/gpt_ref.hpp"

namespace ringtrain::test {
namespace {

class GptParityOnGpu : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { RT_NEED_GPU(); }
};

TEST_P(GptParityOnGpu, LogitsLossGradientsAndTenAdamWSteps) {
  const DType compute = GetParam();
  const gpt_ref::Tolerance worst = gpt_ref::run_parity(
      {gpu_backend(), gpu(), [](const Tensor& t) { return floats(t); }}, source_dir(), compute);
  std::printf(
      "gpt parity on cuda %s: logits %.2e, loss %.2e, gradients %.2e, 10 AdamW losses %.2e\n",
      dtype_name(compute), worst.logits, worst.loss, worst.grads, worst.losses);
}

INSTANTIATE_TEST_SUITE_P(Precision, GptParityOnGpu,
                         ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace ringtrain::test
