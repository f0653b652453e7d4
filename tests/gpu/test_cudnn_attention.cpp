// cuDNN's fused attention (kernels/cuda/cudnn_attention.cpp) against the CPU reference and
// against ringtrain's own CUDA kernel on the same inputs: forward (output and log-sum-exp,
// which the backward reads back) and backward, fp16 and bf16, head sizes 32, 64 and 128,
// T = 1, 5, 131 and 1024, several B x heads (kCases). Each case checks from attention_calls() that
// the path asked for is the one that ran. RINGTRAIN_CUDA_ATTENTION is honoured: `kernel`
// never calls cuDNN, fp32 runs the kernel under `cudnn`, a value outside auto|cudnn|kernel
// and a head size cuDNN refuses under `cudnn` are errors naming the setting. Skipped,
// visibly, without a CUDA device; fails where the build has no cudnn-frontend.
#include <tuple>

#include "kernels/cuda/cudnn_attention.hpp"
#include "tests/gpu/gpu_util.hpp"

namespace ringtrain::test {
namespace {

using kernels::cuda::attention_calls;
using kernels::cuda::AttentionCalls;

// One unit in the last place of a 16-bit value near 1: cuDNN rounds the probabilities and
// the score gradients to the io dtype before its tensor-core products (FlashAttention's
// recipe); results are then off by a few of these relative to the tensor's largest value.
double ulp_of(DType t) { return t == DType::f16 ? 1.0 / 1024 : 1.0 / 128; }

struct Result {
  std::vector<float> out, lse, dqkv;
};

// One case's inputs and outputs, on the host and the device (the same seeds every time).
struct Buffers {
  Pair qkv, out, lse, dout, dqkv;
  Buffers(DType dt, int64_t b, int64_t t, int64_t heads, int64_t hs) {
    const int64_t c = heads * hs;
    qkv = make_pair({b, t, 3 * c}, dt, uniform(b * t * 3 * c, -1.5f, 1.5f, 21));
    out = make_pair({b, t, c}, dt);
    lse = make_pair({b, heads, t}, DType::f32);
    dout = make_pair({b, t, c}, dt, uniform(b * t * c, -1, 1, 22));
    dqkv = make_pair({b, t, 3 * c}, dt);
  }
};

// Forward and backward on the GPU under `mode`; `want_cudnn` and `want_kernel` are the
// calls each path must have taken (2 per case: forward and backward).
Result run_gpu(const char* mode, DType dt, int64_t b, int64_t t, int64_t heads, int64_t hs,
               int64_t want_cudnn, int64_t want_kernel) {
  ScopedEnv env("RINGTRAIN_CUDA_ATTENTION", mode);
  kernels::Backend& gpu = gpu_backend();
  Buffers x(dt, b, t, heads, hs);
  const AttentionCalls before = attention_calls();
  gpu.attention_forward(heads, x.qkv.d(), x.out.d(), x.lse.d());
  gpu.attention_backward(heads, x.qkv.d(), x.out.d(), x.dout.d(), x.lse.d(), x.dqkv.d());
  const AttentionCalls after = attention_calls();
  EXPECT_EQ(after.cudnn - before.cudnn, want_cudnn) << "cuDNN calls under " << mode;
  EXPECT_EQ(after.kernel - before.kernel, want_kernel) << "kernel calls under " << mode;
  return {floats(x.out.d()), floats(x.lse.d()), floats(x.dqkv.d())};
}

Result run_cpu(DType dt, int64_t b, int64_t t, int64_t heads, int64_t hs) {
  kernels::Backend& cpu = cpu_backend();
  Buffers x(dt, b, t, heads, hs);
  cpu.attention_forward(heads, x.qkv.h(), x.out.h(), x.lse.h());
  cpu.attention_backward(heads, x.qkv.h(), x.out.h(), x.dout.h(), x.lse.h(), x.dqkv.h());
  return {floats(x.out.h()), floats(x.lse.h()), floats(x.dqkv.h())};
}

void expect_close(const Result& got, const Result& want, DType dt, const char* against) {
  SCOPED_TRACE(against);
  EXPECT_TRUE(all_close(got.lse, want.lse, 1e-5, 1e-4)) << "log-sum-exp";
  EXPECT_TRUE(all_close(got.out, want.out, rtol_of(dt), 2 * ulp_of(dt) * max_abs(want.out)))
      << "output";
  EXPECT_TRUE(all_close(got.dqkv, want.dqkv, rtol_of(dt), 4 * ulp_of(dt) * max_abs(want.dqkv)))
      << "dq, dk, dv";
}

// One attention shape: batch, tokens, heads, head size.
struct Case {
  int64_t b, t, heads, hs;
};

// Head sizes 64 (GPT-2's), 32 and 128; T = 1, 5, 131 (not a multiple of any tile) and 1024
// (GPT-2's context); B x heads from 2 to 6. Each shape costs cuDNN two graph builds, so the
// list covers the sizes without their full cross product.
const Case kCases[] = {{2, 1, 3, 64},   {3, 5, 2, 32},    {1, 131, 4, 128},
                       {2, 131, 3, 64}, {2, 1024, 3, 64}, {1, 1024, 2, 128}};

class CudnnAttentionTest : public ::testing::TestWithParam<std::tuple<DType, Case>> {
 protected:
  void SetUp() override {
    RT_NEED_GPU();
    ASSERT_TRUE(kernels::cuda::cudnn_sdpa_built())
        << "this build has no cudnn-frontend (CMake's RINGTRAIN_CUDNN_FRONTEND_DIR)";
  }
  DType dt() const { return std::get<0>(GetParam()); }
  Case shape() const { return std::get<1>(GetParam()); }
};

TEST_P(CudnnAttentionTest, MatchesTheCpuAndOurKernel) {
  const auto [b, t, heads, hs] = shape();
  const Result want = run_cpu(dt(), b, t, heads, hs);
  const Result cudnn = run_gpu("cudnn", dt(), b, t, heads, hs, 2, 0);
  const Result kernel = run_gpu("kernel", dt(), b, t, heads, hs, 0, 2);
  expect_close(cudnn, want, dt(), "cuDNN against the CPU");
  expect_close(cudnn, kernel, dt(), "cuDNN against our kernel");
  const Result automatic = run_gpu("auto", dt(), b, t, heads, hs, 2, 0);
  EXPECT_EQ(automatic.out, cudnn.out) << "auto runs the same cuDNN graph";
  EXPECT_EQ(automatic.lse, cudnn.lse);
}

INSTANTIATE_TEST_SUITE_P(DtypeShape, CudnnAttentionTest,
                         ::testing::Combine(::testing::Values(DType::f16, DType::bf16),
                                            ::testing::ValuesIn(kCases)),
                         [](const auto& info) {
                           const Case c = std::get<1>(info.param);
                           return std::string(dtype_name(std::get<0>(info.param))) + "_B" +
                                  std::to_string(c.b) + "_T" + std::to_string(c.t) + "_H" +
                                  std::to_string(c.heads) + "_hs" + std::to_string(c.hs);
                         });

TEST(CudnnAttentionEnv, Fp32RunsOurKernelEvenUnderCudnn) {
  RT_NEED_GPU();
  const Result want = run_cpu(DType::f32, 1, 7, 2, 32);
  const Result got = run_gpu("cudnn", DType::f32, 1, 7, 2, 32, 0, 2);
  EXPECT_TRUE(all_close(got.out, want.out, rtol_of(DType::f32) + 1e-5, 1e-5));
}

TEST(CudnnAttentionEnv, AValueOutsideTheChoicesIsAnErrorNamingIt) {
  RT_NEED_GPU();
  try {
    run_gpu("fast", DType::bf16, 1, 4, 1, 64, 0, 0);
    FAIL() << "RINGTRAIN_CUDA_ATTENTION=fast was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RINGTRAIN_CUDA_ATTENTION='fast'"), std::string::npos)
        << e.what();
  }
}

TEST(CudnnAttentionEnv, AShapeCudnnRefusesIsAnErrorUnderCudnn) {
  RT_NEED_GPU();
  ASSERT_TRUE(kernels::cuda::cudnn_sdpa_built());
  try {
    run_gpu("cudnn", DType::bf16, 1, 4, 1, 264, 0, 0);
    FAIL() << "head size 264 ran under RINGTRAIN_CUDA_ATTENTION=cudnn";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RINGTRAIN_CUDA_ATTENTION=cudnn"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ringtrain::test
