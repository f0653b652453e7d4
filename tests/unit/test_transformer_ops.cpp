// Unit tests of the CPU backend's transformer kernels other than attention (test_attention.cpp)
// (kernels/cpu/cpu_{layernorm,embedding,gelu_tanh,token_xent}.cpp, the residual add):
//  - every op's backward against central finite differences in fp32;
//  - fp16/bf16 inputs against fp32 on the same (rounded) inputs;
//  - 1 and 2 threads give bitwise identical results (the kernels sum in a fixed order), and
//    two runs on 2 threads too.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/kernels.hpp"
#include "layer_test_util.hpp"
#include "test_util.hpp"
#include "transformer_test_util.hpp"

namespace ringtrain {
namespace {

using test::backend;
using test::check_fd;
using test::close;
using test::Host;
using test::rel_err;
using test::rel_err_d;
using test::rounded;
using test::uniform_floats;
using test::weighted;

// ---- layer norm -----------------------------------------------------------------------------

struct LnRun {
  std::vector<float> y, dx, dg, db;
};
LnRun run_layernorm(kernels::Backend& be, int64_t n, int64_t c, DType t,
                    const std::vector<float>& x, const std::vector<float>& g,
                    const std::vector<float>& b, const std::vector<float>& dy) {
  Host hx({n, c}, t, x), hg({c}, DType::f32, g), hb({c}, DType::f32, b), hy({n, c}, t);
  Host mean({n}, DType::f32), rstd({n}, DType::f32);
  be.layernorm_forward(hx.t(), hg.t(), hb.t(), 1e-5f, hy.t(), mean.t(), rstd.t());
  LnRun r{hy.get(), {}, {}, {}};
  if (!dy.empty()) {
    Host hdy({n, c}, t, dy), hdx({n, c}, t), dg({c}, DType::f32), db({c}, DType::f32);
    be.layernorm_backward(hx.t(), hdy.t(), hg.t(), mean.t(), rstd.t(), hdx.t(), dg.t(), db.t());
    r.dx = hdx.get();
    r.dg = dg.get();
    r.db = db.get();
  }
  return r;
}

TEST(LayerNorm, ForwardMatchesDoubleReference) {
  const int64_t n = 37, c = 48;
  const auto x = uniform_floats(size_t(n * c), -3.f, 5.f, 61);
  const auto g = uniform_floats(size_t(c), 0.5f, 1.5f, 62);
  const auto b = uniform_floats(size_t(c), -0.5f, 0.5f, 63);
  auto be = backend();
  const LnRun r = run_layernorm(*be, n, c, DType::f32, x, g, b, {});
  std::vector<double> want(x.size());
  for (int64_t i = 0; i < n; ++i) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < c; ++j) mu += x[size_t(i * c + j)];
    mu /= double(c);
    for (int64_t j = 0; j < c; ++j) var += std::pow(x[size_t(i * c + j)] - mu, 2);
    var /= double(c);
    for (int64_t j = 0; j < c; ++j)
      want[size_t(i * c + j)] =
          (x[size_t(i * c + j)] - mu) / std::sqrt(var + 1e-5) * g[size_t(j)] + b[size_t(j)];
  }
  EXPECT_LE(rel_err_d(r.y, want), 2e-6);
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const int64_t n = 70, c = 24;  // 70 rows: two full blocks of 32 and a partial one
  auto x = uniform_floats(size_t(n * c), -2.f, 2.f, 71);
  auto g = uniform_floats(size_t(c), 0.5f, 1.5f, 72);
  auto b = uniform_floats(size_t(c), -0.5f, 0.5f, 73);
  const auto r = uniform_floats(size_t(n * c), -1.f, 1.f, 74);
  auto be = backend();
  const LnRun run = run_layernorm(*be, n, c, DType::f32, x, g, b, r);
  auto loss = [&] { return weighted(run_layernorm(*be, n, c, DType::f32, x, g, b, {}).y, r); };
  check_fd("dx", x, run.dx, loss);
  check_fd("dgamma", g, run.dg, loss);
  check_fd("dbeta", b, run.db, loss);
}

TEST(LayerNorm, SixteenBitAndThreads) {
  const int64_t n = 100, c = 64;
  const auto g = uniform_floats(size_t(c), 0.5f, 1.5f, 82);
  const auto b = uniform_floats(size_t(c), -0.5f, 0.5f, 83);
  auto be = backend(), two = backend(2);
  for (DType t : {DType::bf16, DType::f16}) {
    const auto x = rounded(uniform_floats(size_t(n * c), -2.f, 2.f, 81), t);
    const auto dy = rounded(uniform_floats(size_t(n * c), -1.f, 1.f, 84), t);
    const LnRun ref = run_layernorm(*be, n, c, DType::f32, x, g, b, dy);
    const LnRun got = run_layernorm(*be, n, c, t, x, g, b, dy);
    const double tol = t == DType::bf16 ? 8e-3 : 1e-3;  // one rounding of the result
    EXPECT_LE(rel_err(got.y, ref.y), tol) << dtype_name(t);
    EXPECT_LE(rel_err(got.dx, ref.dx), tol) << dtype_name(t);
    EXPECT_LE(rel_err(got.dg, ref.dg), 1e-6) << dtype_name(t) << " (fp32 sums of the same inputs)";
  }
  const auto x = uniform_floats(size_t(n * c), -2.f, 2.f, 85);
  const auto dy = uniform_floats(size_t(n * c), -1.f, 1.f, 86);
  const LnRun a = run_layernorm(*be, n, c, DType::f32, x, g, b, dy);
  const LnRun b2 = run_layernorm(*two, n, c, DType::f32, x, g, b, dy);
  EXPECT_EQ(a.dx, b2.dx);
  EXPECT_EQ(a.dg, b2.dg);
  EXPECT_EQ(a.db, b2.db);
}

// ---- GELU (tanh) ----------------------------------------------------------------------------

// GELU's tanh form in double, with 0.5 (1 + tanh u) written as a sigmoid (no cancellation
// where tanh u is near -1, so the reference stays accurate for large negative x).
double gelu_sigmoid_ref(double v) {
  const double u = std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v);
  return 1 / (1 + std::exp(-2 * u));
}
double gelu_ref(double v) { return v * gelu_sigmoid_ref(v); }
double gelu_grad_ref(double v) {
  const double s = gelu_sigmoid_ref(v);
  return s + v * 2 * s * (1 - s) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * v * v);
}

TEST(GeluTanh, ForwardReferenceFiniteDifferencesAndSixteenBit) {
  const int64_t n = 3000;  // not a multiple of the 16 lanes: a masked tail
  auto x = uniform_floats(size_t(n), -6.f, 6.f, 91);
  const auto r = uniform_floats(size_t(n), -1.f, 1.f, 92);
  auto be = backend();
  auto fwd = [&](DType t, const std::vector<float>& xs, DType ty) {
    Host hx({n}, t, xs), hy({n}, ty);
    be->gelu_tanh(hx.t(), hy.t());
    return hy.get();
  };
  auto bwd = [&](DType t, const std::vector<float>& xs, DType td, DType tdx) {
    Host hx({n}, t, xs), hd({n}, td, r), hdx({n}, tdx);
    be->gelu_tanh_backward(hx.t(), hd.t(), hdx.t());
    return hdx.get();
  };
  const auto y = fwd(DType::f32, x, DType::f32);
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_TRUE(close(y[i], gelu_ref(x[i]), 1e-6, 1e-7))
        << "at " << x[i] << ": " << y[i] << " vs " << gelu_ref(x[i]);
  const auto dx = bwd(DType::f32, x, DType::f32, DType::f32);
  check_fd(
      "dx", x, dx, [&] { return weighted(fwd(DType::f32, x, DType::f32), r); }, 1e-3f, 200);
  // 16-bit tensors: the fp32 arithmetic on the widened inputs, rounded once, whichever
  // dtypes are mixed.
  for (DType t : {DType::bf16, DType::f16}) {
    const auto xr = rounded(x, t);
    const auto y32 = fwd(DType::f32, xr, DType::f32);
    EXPECT_EQ(fwd(t, xr, t), rounded(y32, t)) << dtype_name(t);
    EXPECT_EQ(fwd(t, xr, DType::f32), y32) << dtype_name(t);
    const auto d32 = bwd(DType::f32, xr, t, DType::f32);  // dy rounded to t by Host
    EXPECT_EQ(bwd(t, xr, t, t), rounded(d32, t)) << dtype_name(t);
    EXPECT_EQ(bwd(t, xr, t, DType::f32), d32) << dtype_name(t);
  }
}

// Over [-10, 10] against the double-precision reference: GELU within 1e-6 relative (or
// 1e-7 absolute near zero), its gradient within 4e-6 of max(1, |gelu'|) (the gradient
// crosses zero near x = -0.75). A sigmoid's reciprocal left at VRCP14PS's 2^-14 would fail.
// Large and non-finite inputs keep their limits.
TEST(GeluTanh, MatchesDoubleOverRangeAndLimits) {
  const int64_t n = 200001;
  const auto count = static_cast<size_t>(n);
  std::vector<float> x(count), ones(count, 1.f), y(count), g(count);
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = -10.f + 20.f * float(i) / float(n - 1);
  auto be = backend();
  const Tensor tx(x.data(), {n}, DType::f32), ty(y.data(), {n}, DType::f32);
  be->gelu_tanh(tx, ty);
  be->gelu_tanh_backward(tx, Tensor(ones.data(), {n}, DType::f32),
                         Tensor(g.data(), {n}, DType::f32));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(close(y[i], gelu_ref(x[i]), 1e-6, 1e-7))
        << "gelu at " << x[i] << ": " << y[i] << " vs " << gelu_ref(x[i]);
    const double want = gelu_grad_ref(x[i]);
    ASSERT_LE(std::fabs(g[i] - want), 4e-6 * std::max(1.0, std::fabs(want)))
        << "gelu' at " << x[i] << ": " << g[i] << " vs " << want;
  }
  std::vector<float> lim = {NAN, INFINITY, 100.f, -100.f, 1e30f, 0.f};
  std::vector<float> ly(lim.size()), lg(lim.size()), lo(lim.size(), 1.f);
  const int64_t m = int64_t(lim.size());
  be->gelu_tanh(Tensor(lim.data(), {m}, DType::f32), Tensor(ly.data(), {m}, DType::f32));
  be->gelu_tanh_backward(Tensor(lim.data(), {m}, DType::f32), Tensor(lo.data(), {m}, DType::f32),
                         Tensor(lg.data(), {m}, DType::f32));
  EXPECT_TRUE(std::isnan(ly[0]) && std::isnan(lg[0]));
  EXPECT_EQ(ly[1], INFINITY);
  EXPECT_EQ(ly[2], 100.f);
  EXPECT_EQ(lg[2], 1.f);
  EXPECT_LE(std::fabs(ly[3]), 1e-30f);
  EXPECT_LE(std::fabs(lg[3]), 1e-30f);
  EXPECT_EQ(ly[4], 1e30f);
  EXPECT_EQ(ly[5], 0.f);
  EXPECT_EQ(lg[5], 0.5f);
}

// ---- residual add ----------------------------------------------------------------------

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = std::bit_cast<uint32_t>(v[i]);
  return b;
}

// Any mix of float dtypes: the fp32 sum of the (widened) operands, rounded once to the
// output's dtype; in place too; 1 and 2 threads (more than one parallel chunk). Some sums
// are denormal (which VCVTNEPS2BF16 would flush) or nan.
TEST(Add, EveryDtypeMixIsTheFp32SumRoundedOnce) {
  const int64_t n = 40'003;  // a masked tail
  auto av = uniform_floats(size_t(n), -3.f, 3.f, 111);
  auto bv = uniform_floats(size_t(n), -3.f, 3.f, 112);
  for (size_t i : {5, 17, 40'000}) {
    av[i] = -3e-39f * float(i % 7);
    bv[i] = 1e-40f;
  }
  av[33] = NAN;
  auto one = backend(), two = backend(2);
  const DType dts[] = {DType::f32, DType::bf16, DType::f16};
  for (DType ta : dts)
    for (DType tb : dts)
      for (DType ty : dts) {
        const auto ar = rounded(av, ta), br = rounded(bv, tb);
        std::vector<float> want(ar.size());
        for (size_t i = 0; i < want.size(); ++i) want[i] = ar[i] + br[i];
        want = rounded(want, ty);
        Host ha({n}, ta, ar), hb({n}, tb, br), hy({n}, ty), hy2({n}, ty);
        one->add(ha.t(), hb.t(), hy.t());
        two->add(ha.t(), hb.t(), hy2.t());
        const std::string what = cat(dtype_name(ta), " + ", dtype_name(tb), " -> ", dtype_name(ty));
        ASSERT_EQ(bits(hy.get()), bits(want)) << what;
        ASSERT_EQ(bits(hy2.get()), bits(want)) << what << ", 2 threads";
        if (ta == ty) {
          one->add(ha.t(), hb.t(), ha.t());
          ASSERT_EQ(bits(ha.get()), bits(want)) << what << " in place";
        }
      }
}

// ---- embedding ------------------------------------------------------------------------------

TEST(Embedding, GatherScatterAddAndThreads) {
  const int64_t B = 3, T = 7, V = 11, C = 130, P = 9;  // 130: three channel blocks
  std::vector<int32_t> tok(static_cast<size_t>(B * T));
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 5 + 3) % 4);  // repeated ids
  tok[4] = int32_t(V - 1);
  Tensor tokens(tok.data(), {B, T}, DType::i32);
  auto wte = uniform_floats(size_t(V * C), -1.f, 1.f, 101);
  auto wpe = uniform_floats(size_t(P * C), -1.f, 1.f, 102);
  const auto r = uniform_floats(size_t(B * T * C), -1.f, 1.f, 103);
  auto be = backend(), two = backend(2);
  auto fwd = [&](DType t) {
    Host w({V, C}, t, wte), p({P, C}, t, wpe), y({B, T, C}, t);
    be->embedding_forward(tokens, w.t(), p.p(), y.t());
    return y.get();
  };
  auto bwd = [&](kernels::Backend& b, DType t) {
    Host dy({B, T, C}, t, r), dw({V, C}, DType::f32), dp({P, C}, DType::f32);
    b.embedding_backward(tokens, dy.t(), dw.t(), dp.p());
    return std::make_pair(dw.get(), dp.get());
  };
  const auto y = fwd(DType::f32);
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c)
      ASSERT_EQ(y[size_t(i * C + c)],
                wte[size_t(tok[size_t(i)] * C + c)] + wpe[size_t((i % T) * C + c)]);
  const auto [dw, dp] = bwd(*be, DType::f32);
  check_fd("dwte", wte, dw, [&] { return weighted(fwd(DType::f32), r); });
  check_fd("dwpe", wpe, dp, [&] { return weighted(fwd(DType::f32), r); });
  EXPECT_EQ(dp[size_t((P - 1) * C)], 0.f) << "a position beyond T got a gradient";
  const auto [dw2, dp2] = bwd(*two, DType::f32);
  EXPECT_EQ(dw, dw2);
  EXPECT_EQ(dp, dp2);
  for (DType t : {DType::bf16, DType::f16}) {
    const double tol = t == DType::bf16 ? 8e-3 : 1e-3;
    EXPECT_LE(rel_err(bwd(*be, t).first, dw), tol) << dtype_name(t);
  }
  tok[2] = int32_t(V);
  EXPECT_TRUE(test::throws_kind([&] { fwd(DType::f32); }, ErrorKind::runtime));
}

// ---- token cross-entropy --------------------------------------------------------------------

TEST(TokenXent, LossGradientPaddingAndInPlace) {
  const int64_t N = 13, V = 50, Vp = 64;
  auto logits = uniform_floats(size_t(N * Vp), -4.f, 4.f, 111);
  std::vector<int32_t> tg(static_cast<size_t>(N));
  for (size_t i = 0; i < tg.size(); ++i) tg[i] = int32_t((i * 7) % V);
  tg[3] = int32_t(V - 1);
  Tensor targets(tg.data(), {N}, DType::i32);
  auto be = backend();
  auto loss = [&] {
    Tensor l(logits.data(), {N, Vp}, DType::f32);
    return be->token_xent(l, targets, V, 1.f, nullptr).loss_sum / double(N);
  };
  double want = 0;
  for (int64_t i = 0; i < N; ++i) {
    double mx = -1e300, s = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(logits[size_t(i * Vp + j)]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(logits[size_t(i * Vp + j)] - mx);
    want += mx + std::log(s) - logits[size_t(i * Vp + tg[size_t(i)])];
  }
  EXPECT_TRUE(close(loss(), want / double(N), 1e-6, 0)) << loss() << " vs " << want / double(N);
  std::vector<float> grad(logits.size());
  Tensor l(logits.data(), {N, Vp}, DType::f32), d(grad.data(), {N, Vp}, DType::f32);
  be->token_xent(l, targets, V, 1.f, &d);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = V; j < Vp; ++j)
      ASSERT_EQ(grad[size_t(i * Vp + j)], 0.f) << "padding column " << j;
  check_fd("dlogits", logits, grad, loss, 1e-2f, 200);
  // In place (the fused classifier): the same gradient, written over the logits.
  std::vector<float> inplace = logits;
  Tensor li(inplace.data(), {N, Vp}, DType::f32);
  be->token_xent(li, targets, V, 1.f, &li);
  EXPECT_EQ(inplace, grad);
  tg[0] = int32_t(V);  // a padding column is not a valid target
  EXPECT_TRUE(test::throws_kind([&] { loss(); }, ErrorKind::runtime));
}

}  // namespace
}  // namespace ringtrain
