// GPT parity with PyTorch, as llm.c's test_gpt2: models/gpt-tiny.pbtxt built at the size of
// tests/ref/gpt_ref.h5 (made by tests/ref/make_gpt_ref.py, float64 PyTorch; this test needs no
// PyTorch), run through the real graph executor with the reference's parameters and tokens:
// the logits, the loss, every parameter gradient (the tied embedding's sums the lookup and
// the head) and the losses of 10 AdamW steps (decay on the Linear weights only, as the model
// file's defaults give), in fp32 and in bf16/fp16 mixed precision.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
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

class GptParity : public ::testing::TestWithParam<DType> {};

TEST_P(GptParity, LogitsLossGradientsAndTenAdamWSteps) {
  const DType compute = GetParam();
  auto backend = kernels::make_cpu_backend(1);
  const gpt_ref::Tolerance worst =
      gpt_ref::run_parity({*backend, Device{}, floats_of}, RINGTRAIN_SOURCE_DIR, compute);
  std::printf("gpt parity %s: logits %.2e, loss %.2e, gradients %.2e, 10 AdamW losses %.2e\n",
              dtype_name(compute), worst.logits, worst.loss, worst.grads, worst.losses);
}

INSTANTIATE_TEST_SUITE_P(Precision, GptParity,
                         ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace ringtrain
