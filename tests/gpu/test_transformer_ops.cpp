// The CUDA backend's transformer ops (kernels/cuda/transformer.cu, embedding_backward.cu)
// against the CPU reference on the same inputs, for fp32, fp16 and bf16 and for one token, a
// short sequence and one longer than the CPU kernel's tile and not a multiple of the CUDA
// kernel's 32 keys per step: embedding (and its backward over GPT-2's vocabulary, bitwise),
// layer norm, causal attention (our kernel under RINGTRAIN_CUDA_ATTENTION=kernel: forward,
// log-sum-exp, backward, at several head sizes; above the kernel's limit refused), GELU (tanh)
// and the fused token cross-entropy over a padded vocabulary. Skipped, visibly, without a
// CUDA device.
#include <tuple>

#include "tests/gpu/gpu_util.hpp"

namespace ringtrain::test {
namespace {

class TransformerOpTest : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {
 protected:
  void SetUp() override { RT_NEED_GPU(); }
  DType dt() const { return std::get<0>(GetParam()); }
  int64_t seq() const { return std::get<1>(GetParam()); }
  kernels::Backend& cpu() { return cpu_backend(); }
  kernels::Backend& gpu() { return gpu_backend(); }
  // Forward (output, log-sum-exp) and backward of causal attention against the CPU.
  void check_attention(int64_t b, int64_t t, int64_t heads, int64_t hs);
};

std::vector<float> tokens(int64_t n, int64_t vocab, uint32_t seed) {
  auto v = uniform(n, 0, float(vocab), seed);
  for (auto& x : v) x = std::floor(x);
  return v;
}

TEST_P(TransformerOpTest, Embedding) {
  const int64_t b = 3, t = seq(), v = 37, c = 48;
  Pair tok = make_pair({b, t}, DType::i32, tokens(b * t, v, 1));
  Pair wte = make_pair({v, c}, dt(), uniform(v * c, -1, 1, 2));
  Pair wpe = make_pair({t + 2, c}, dt(), uniform((t + 2) * c, -1, 1, 3));
  Pair y = make_pair({b, t, c}, dt());
  cpu().embedding_forward(tok.h(), wte.h(), wpe.p_h(), y.h());
  gpu().embedding_forward(tok.d(), wte.d(), wpe.p_d(), y.d());
  EXPECT_TRUE(all_close(floats(y.d()), floats(y.h()), 0, 0)) << "one sum, one rounding";
  Pair dy = make_pair({b, t, c}, dt(), uniform(b * t * c, -1, 1, 4));
  Pair dw = make_pair({v, c}, DType::f32), dp = make_pair({t + 2, c}, DType::f32);
  cpu().embedding_backward(tok.h(), dy.h(), dw.h(), dp.p_h());
  gpu().embedding_backward(tok.d(), dy.d(), dw.d(), dp.p_d());
  EXPECT_TRUE(all_close(floats(dw.d()), floats(dw.h()), 0, 0)) << "same order of summation";
  EXPECT_TRUE(all_close(floats(dp.d()), floats(dp.h()), 0, 0));
}

// GPT-2's vocabulary and a longer sequence: most tokens once, a few hundreds of times (long
// runs after the GPU's sort by token), a token id near the top of the vocabulary; the
// gradients bitwise the CPU's (each row summed from zero in position order).
TEST(TransformerEmbeddingTest, BackwardOverALargeVocabularyIsTheCpusSums) {
  RT_NEED_GPU();
  const int64_t b = 2, t = 1024, v = 50304, c = 96;
  std::vector<float> ids = tokens(b * t, v, 41);
  for (float& id : ids) id = std::min(id, float(v - 1));
  for (int64_t i = 0; i < b * t; i += 3) ids[size_t(i)] = float(i % 7);  // 7 frequent tokens
  ids[5] = float(v - 1);
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    Pair tok = make_pair({b, t}, DType::i32, ids);
    Pair dy = make_pair({b, t, c}, dt, uniform(b * t * c, -1, 1, 42));
    Pair dw = make_pair({v, c}, DType::f32, uniform(v * c, -1, 1, 43));  // overwritten
    Pair dp = make_pair({t + 5, c}, DType::f32, uniform((t + 5) * c, -1, 1, 44));
    cpu_backend().embedding_backward(tok.h(), dy.h(), dw.h(), dp.p_h());
    gpu_backend().embedding_backward(tok.d(), dy.d(), dw.d(), dp.p_d());
    EXPECT_TRUE(all_close(floats(dw.d()), floats(dw.h()), 0, 0));
    EXPECT_TRUE(all_close(floats(dp.d()), floats(dp.h()), 0, 0));
  }
}

TEST_P(TransformerOpTest, LayerNorm) {
  const int64_t rows = 2 * seq(), c = 96;
  Pair x = make_pair({rows, c}, dt(), uniform(rows * c, -2, 3, 5));
  Pair g = make_pair({c}, DType::f32, uniform(c, 0.5f, 1.5f, 6));
  Pair bt = make_pair({c}, DType::f32, uniform(c, -0.5f, 0.5f, 7));
  Pair y = make_pair({rows, c}, dt()), mean = make_pair({rows}, DType::f32);
  Pair rstd = make_pair({rows}, DType::f32);
  cpu().layernorm_forward(x.h(), g.h(), bt.h(), 1e-5f, y.h(), mean.h(), rstd.h());
  gpu().layernorm_forward(x.d(), g.d(), bt.d(), 1e-5f, y.d(), mean.d(), rstd.d());
  EXPECT_TRUE(all_close(floats(mean.d()), floats(mean.h()), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(floats(rstd.d()), floats(rstd.h()), 1e-5, 0));
  EXPECT_TRUE(all_close(floats(y.d()), floats(y.h()), rtol_of(dt()) + 1e-5, 1e-5));
  Pair dy = make_pair({rows, c}, dt(), uniform(rows * c, -1, 1, 8)),
       dx = make_pair({rows, c}, dt());
  Pair dg = make_pair({c}, DType::f32), db = make_pair({c}, DType::f32);
  cpu().layernorm_backward(x.h(), dy.h(), g.h(), mean.h(), rstd.h(), dx.h(), dg.h(), db.h());
  gpu().layernorm_backward(x.d(), dy.d(), g.d(), mean.d(), rstd.d(), dx.d(), dg.d(), db.d());
  EXPECT_TRUE(all_close(floats(dx.d()), floats(dx.h()), rtol_of(dt()) + 1e-5, 1e-4));
  EXPECT_TRUE(all_close(floats(dg.d()), floats(dg.h()), 1e-5, 1e-4));
  EXPECT_TRUE(all_close(floats(db.d()), floats(db.h()), 1e-5, 1e-4));
}

// Head sizes: 32 (one dimension per lane), GPT-2's 64, 40 (a second, partial round of
// lanes) and 256 (all kMaxLaneDims rounds, the kernel's limit).
TEST_P(TransformerOpTest, Attention) {
  for (const auto& [heads, hs] : {std::pair<int64_t, int64_t>{3, 32}, {2, 64}, {2, 40}, {1, 256}}) {
    SCOPED_TRACE(::testing::Message() << heads << " heads of " << hs);
    check_attention(2, seq(), heads, hs);
  }
}

TEST_P(TransformerOpTest, AttentionRejectsHeadsAboveTheKernelsLimit) {
  const int64_t b = 1, t = seq(), heads = 1, hs = 264, c = heads * hs;
  Pair qkv = make_pair({b, t, 3 * c}, dt()), out = make_pair({b, t, c}, dt());
  Pair lse = make_pair({b, heads, t}, DType::f32);
  try {
    gpu().attention_forward(heads, qkv.d(), out.d(), lse.d());
    FAIL() << "head size 264 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head size 264"), std::string::npos) << e.what();
  }
}

void TransformerOpTest::check_attention(int64_t b, int64_t t, int64_t heads, int64_t hs) {
  // Our kernel at every dtype (test_cudnn_attention.cpp tests cuDNN's).
  ScopedEnv env("RINGTRAIN_CUDA_ATTENTION", "kernel");
  const int64_t c = heads * hs;
  Pair qkv = make_pair({b, t, 3 * c}, dt(), uniform(b * t * 3 * c, -1.5f, 1.5f, 9));
  Pair out = make_pair({b, t, c}, dt()), lse = make_pair({b, heads, t}, DType::f32);
  cpu().attention_forward(heads, qkv.h(), out.h(), lse.h());
  gpu().attention_forward(heads, qkv.d(), out.d(), lse.d());
  EXPECT_TRUE(all_close(floats(lse.d()), floats(lse.h()), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(floats(out.d()), floats(out.h()), rtol_of(dt()) + 1e-5, 1e-5));
  Pair dout = make_pair({b, t, c}, dt(), uniform(b * t * c, -1, 1, 10));
  Pair dqkv = make_pair({b, t, 3 * c}, dt());
  // Both backward passes from the CPU's forward, so they see the same out and lse.
  Pair out_d = make_pair({b, t, c}, dt(), floats(out.h()));
  Pair lse_d = make_pair({b, heads, t}, DType::f32, floats(lse.h()));
  cpu().attention_backward(heads, qkv.h(), out.h(), dout.h(), lse.h(), dqkv.h());
  gpu().attention_backward(heads, qkv.d(), out_d.d(), dout.d(), lse_d.d(), dqkv.d());
  const auto want = floats(dqkv.h());
  EXPECT_TRUE(all_close(floats(dqkv.d()), want, rtol_of(dt()) + 1e-5, 1e-4 * max_abs(want)));
}

TEST_P(TransformerOpTest, GeluTanh) {
  const int64_t n = seq() * 97;
  Pair x = make_pair({n}, dt(), uniform(n, -5, 5, 11)), y = make_pair({n}, dt());
  cpu().gelu_tanh(x.h(), y.h());
  gpu().gelu_tanh(x.d(), y.d());
  EXPECT_TRUE(all_close(floats(y.d()), floats(y.h()), rtol_of(dt()) + 1e-6, 1e-6));
  Pair dy = make_pair({n}, dt(), uniform(n, -1, 1, 12)), dx = make_pair({n}, dt());
  cpu().gelu_tanh_backward(x.h(), dy.h(), dx.h());
  gpu().gelu_tanh_backward(x.d(), dy.d(), dx.d());
  EXPECT_TRUE(all_close(floats(dx.d()), floats(dx.h()), rtol_of(dt()) + 1e-6, 1e-6));
}

TEST_P(TransformerOpTest, TokenCrossEntropy) {
  const int64_t rows = seq() * 2, vocab = 301, vp = 320;
  Pair logits = make_pair({rows, vp}, DType::f32, uniform(rows * vp, -4, 4, 13));
  Pair tg = make_pair({rows}, DType::i32, tokens(rows, vocab, 14));
  Pair d = make_pair({rows, vp}, DType::f32);
  const auto want = cpu().token_xent(logits.h(), tg.h(), vocab, 2.f, &d.h());
  const auto got = gpu().token_xent(logits.d(), tg.d(), vocab, 2.f, &d.d());
  EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-5 * std::fabs(want.loss_sum));
  EXPECT_EQ(got.correct, want.correct);
  EXPECT_TRUE(all_close(floats(d.d()), floats(d.h()), 1e-5, 1e-7));
  // In place over the logits (the fused classifier).
  gpu().token_xent(logits.d(), tg.d(), vocab, 2.f, &logits.d());
  EXPECT_TRUE(all_close(floats(logits.d()), floats(d.h()), 1e-5, 1e-7));
}

INSTANTIATE_TEST_SUITE_P(DtypeSeq, TransformerOpTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Values(int64_t(1), int64_t(5),
                                                              int64_t(131))),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_T" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace ringtrain::test
