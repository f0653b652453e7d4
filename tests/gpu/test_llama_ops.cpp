// The CUDA backend's Llama ops (kernels/cuda/llama.cu) against the CPU reference on the same
// inputs, for fp32, fp16 and bf16 and for one token, a short sequence and a longer one: RMS
// norm (forward, backward and the weight's gradient), the elementwise product of a gated MLP
// and its backward, and the rotary pack of grouped-query attention (kv_heads 1, 2 and =
// heads; rotation on and off) and its backward. Skipped, visibly, without a CUDA device.
#include <tuple>

#include "tests/gpu/gpu_util.hpp"

namespace ringtrain::test {
namespace {

class LlamaOpTest : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {
 protected:
  void SetUp() override { RT_NEED_GPU(); }
  DType dt() const { return std::get<0>(GetParam()); }
  int64_t seq() const { return std::get<1>(GetParam()); }
  kernels::Backend& cpu() { return cpu_backend(); }
  kernels::Backend& gpu() { return gpu_backend(); }
};

TEST_P(LlamaOpTest, RmsNorm) {
  const int64_t rows = 2 * seq(), c = 96;
  Pair x = make_pair({rows, c}, dt(), uniform(rows * c, -2, 3, 5));
  Pair g = make_pair({c}, DType::f32, uniform(c, 0.5f, 1.5f, 6));
  Pair y = make_pair({rows, c}, dt()), rstd = make_pair({rows}, DType::f32);
  cpu().rmsnorm_forward(x.h(), g.h(), 1e-5f, y.h(), rstd.h());
  gpu().rmsnorm_forward(x.d(), g.d(), 1e-5f, y.d(), rstd.d());
  EXPECT_TRUE(all_close(floats(rstd.d()), floats(rstd.h()), 1e-5, 0));
  EXPECT_TRUE(all_close(floats(y.d()), floats(y.h()), rtol_of(dt()) + 1e-5, 1e-5));
  Pair dy = make_pair({rows, c}, dt(), uniform(rows * c, -1, 1, 8)),
       dx = make_pair({rows, c}, dt());
  Pair dw = make_pair({c}, DType::f32);
  cpu().rmsnorm_backward(x.h(), dy.h(), g.h(), rstd.h(), dx.h(), dw.h());
  gpu().rmsnorm_backward(x.d(), dy.d(), g.d(), rstd.d(), dx.d(), dw.d());
  EXPECT_TRUE(all_close(floats(dx.d()), floats(dx.h()), rtol_of(dt()) + 1e-5, 1e-4));
  EXPECT_TRUE(all_close(floats(dw.d()), floats(dw.h()), 1e-5, 1e-4));
}

TEST_P(LlamaOpTest, Mul) {
  const int64_t n = seq() * 97;
  Pair a = make_pair({n}, dt(), uniform(n, -3, 3, 11)),
       b = make_pair({n}, dt(), uniform(n, -3, 3, 12));
  Pair y = make_pair({n}, dt());
  cpu().mul(a.h(), b.h(), y.h());
  gpu().mul(a.d(), b.d(), y.d());
  EXPECT_TRUE(all_close(floats(y.d()), floats(y.h()), 0, 0)) << "one product, one rounding";
  Pair dy = make_pair({n}, dt(), uniform(n, -1, 1, 13));
  Pair da = make_pair({n}, dt()), db = make_pair({n}, dt());
  cpu().mul_backward(a.h(), b.h(), dy.h(), da.h(), db.h());
  gpu().mul_backward(a.d(), b.d(), dy.d(), da.d(), db.d());
  EXPECT_TRUE(all_close(floats(da.d()), floats(da.h()), 0, 0));
  EXPECT_TRUE(all_close(floats(db.d()), floats(db.h()), 0, 0));
}

TEST_P(LlamaOpTest, RopePack) {
  const int64_t b = 2, t = seq(), heads = 4, d = 16;
  for (const auto& [kv, theta] :
       {std::pair<int64_t, double>{1, 10000.0}, {2, 500000.0}, {4, 10000.0}, {2, 0.0}}) {
    SCOPED_TRACE(::testing::Message() << "kv_heads " << kv << ", theta " << theta);
    const kernels::RopeConfig cfg{heads, kv, d, theta};
    const int64_t c = heads * d, kvc = kv * d;
    Pair q = make_pair({b, t, c}, dt(), uniform(b * t * c, -2, 2, 21));
    Pair k = make_pair({b, t, kvc}, dt(), uniform(b * t * kvc, -2, 2, 22));
    Pair v = make_pair({b, t, kvc}, dt(), uniform(b * t * kvc, -2, 2, 23));
    Pair qkv = make_pair({b, t, 3 * c}, dt());
    cpu().rope_pack(cfg, q.h(), k.h(), v.h(), qkv.h());
    gpu().rope_pack(cfg, q.d(), k.d(), v.d(), qkv.d());
    EXPECT_TRUE(all_close(floats(qkv.d()), floats(qkv.h()), rtol_of(dt()) + 1e-6, 1e-6));
    Pair g = make_pair({b, t, 3 * c}, dt(), uniform(b * t * 3 * c, -1, 1, 24));
    Pair dq = make_pair({b, t, c}, dt()), dk = make_pair({b, t, kvc}, dt()),
         dv = make_pair({b, t, kvc}, dt());
    cpu().rope_pack_backward(cfg, g.h(), dq.h(), dk.h(), dv.h());
    gpu().rope_pack_backward(cfg, g.d(), dq.d(), dk.d(), dv.d());
    EXPECT_TRUE(all_close(floats(dq.d()), floats(dq.h()), rtol_of(dt()) + 1e-6, 1e-6));
    EXPECT_TRUE(all_close(floats(dk.d()), floats(dk.h()), rtol_of(dt()) + 1e-6, 1e-5));
    EXPECT_TRUE(all_close(floats(dv.d()), floats(dv.h()), rtol_of(dt()) + 1e-6, 1e-5));
  }
}

INSTANTIATE_TEST_SUITE_P(DtypeSeq, LlamaOpTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Values(int64_t(1), int64_t(5),
                                                              int64_t(131))),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_T" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace ringtrain::test
