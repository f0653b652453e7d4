// The choice between cuDNN's fused attention and our CUDA kernel (attention_rule.hpp), on any
// machine (label unit): the RINGTRAIN_CUDA_ATTENTION values, fp32 always on our kernel, auto
// falling back where the build or cuDNN cannot, `cudnn` refusing to fall back, and the
// path report gpu_bench prints (attention_paths_between).
#include <gtest/gtest.h>

#include <string>

#include "core/error.hpp"
#include "kernels/cuda/attention_rule.hpp"
#include "kernels/cuda/cudnn_attention.hpp"

namespace ringtrain::test {
namespace {

using kernels::cuda::AttentionMode;
using kernels::cuda::AttentionPath;
using kernels::cuda::choose_attention_path;

std::string input_error(AttentionMode mode, bool built, DType t, bool supported) {
  try {
    choose_attention_path(mode, built, t, supported, "head size 264 is not supported");
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 1) << "a user-fixable setting: " << e.what();
    return e.what();
  }
  return "";
}

TEST(AttentionRule, ParsesTheThreeValuesAndNamesABadOne) {
  using kernels::cuda::parse_attention_mode;
  EXPECT_EQ(parse_attention_mode(""), AttentionMode::automatic);
  EXPECT_EQ(parse_attention_mode("auto"), AttentionMode::automatic);
  EXPECT_EQ(parse_attention_mode("cudnn"), AttentionMode::cudnn);
  EXPECT_EQ(parse_attention_mode("kernel"), AttentionMode::kernel);
  try {
    parse_attention_mode("cuDNN");
    FAIL() << "cuDNN (capitalised) was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "RINGTRAIN_CUDA_ATTENTION='cuDNN' is not one of auto, cudnn, kernel");
  }
}

TEST(AttentionRule, AutoTakesCudnnOnlyForSupportedSixteenBitShapesOfABuildWithIt) {
  for (DType t : {DType::f16, DType::bf16}) {
    EXPECT_EQ(choose_attention_path(AttentionMode::automatic, true, t, true, ""),
              AttentionPath::cudnn);
    EXPECT_EQ(choose_attention_path(AttentionMode::automatic, true, t, false, "refused"),
              AttentionPath::kernel);
    EXPECT_EQ(choose_attention_path(AttentionMode::automatic, false, t, true, ""),
              AttentionPath::kernel);
    EXPECT_TRUE(kernels::cuda::attention_asks_cudnn(AttentionMode::automatic, true, t));
    EXPECT_FALSE(kernels::cuda::attention_asks_cudnn(AttentionMode::automatic, false, t));
    EXPECT_FALSE(kernels::cuda::attention_asks_cudnn(AttentionMode::kernel, true, t));
  }
}

TEST(AttentionRule, Fp32AndKernelModeAlwaysRunOurKernel) {
  for (AttentionMode m : {AttentionMode::automatic, AttentionMode::cudnn, AttentionMode::kernel}) {
    EXPECT_EQ(choose_attention_path(m, true, DType::f32, true, ""), AttentionPath::kernel);
    EXPECT_FALSE(kernels::cuda::attention_asks_cudnn(m, true, DType::f32));
  }
  for (DType t : {DType::f16, DType::bf16})
    EXPECT_EQ(choose_attention_path(AttentionMode::kernel, true, t, true, ""),
              AttentionPath::kernel);
}

TEST(AttentionRule, CudnnModeNeverFallsBackSilently) {
  EXPECT_EQ(choose_attention_path(AttentionMode::cudnn, true, DType::bf16, true, ""),
            AttentionPath::cudnn);
  const std::string not_built = input_error(AttentionMode::cudnn, false, DType::bf16, true);
  EXPECT_NE(not_built.find("RINGTRAIN_CUDA_ATTENTION=cudnn, but this build has no cudnn-frontend"),
            std::string::npos)
      << not_built;
  const std::string refused = input_error(AttentionMode::cudnn, true, DType::f16, false);
  EXPECT_NE(refused.find("cannot run this fp16 attention: head size 264 is not supported"),
            std::string::npos)
      << refused;
}

TEST(AttentionRule, PathsBetweenTwoReadingsOfTheCounts) {
  using kernels::cuda::attention_paths_between;
  EXPECT_EQ(attention_paths_between({3, 4}, {5, 4}), "cudnn");
  EXPECT_EQ(attention_paths_between({3, 4}, {3, 6}), "kernel");
  EXPECT_EQ(attention_paths_between({3, 4}, {4, 5}), "cudnn+kernel");
  EXPECT_EQ(attention_paths_between({3, 4}, {3, 4}), "none");
}

}  // namespace
}  // namespace ringtrain::test
