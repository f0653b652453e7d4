// Unit tests of the CPU backend's transformer kernels (kernels/cpu/cpu_{attention,layernorm,
// embedding,gelu_tanh,token_xent}.cpp):
//  - attention against a naive double-precision reference (forward, log-sum-exp, backward)
//    with T below, at and not a multiple of the tile, one head, one token;
//  - the causal mask: perturbing future tokens leaves earlier outputs bitwise unchanged and
//    earlier losses send no gradient to future tokens;
//  - every op's backward against central finite differences in fp32;
//  - fp16/bf16 inputs against fp32 on the same (rounded) inputs;
//  - 1 and 2 threads give bitwise identical results (the kernels sum in a fixed order), and
//    two runs on 2 threads too;
//  - attention on every CPU path: oneDNN tile GEMMs and the tile kernels (AVX-512 and
//    baseline builds).
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

namespace ringtrain {
namespace {

using test::close;
using test::copy_of;
using test::rel_err;
using test::uniform_floats;

constexpr double kRtol = 2e-2, kAtol = 2e-3;  // finite differences in fp32 (as test_cnn.cpp)

std::unique_ptr<kernels::Backend> backend(int threads = 1) {
  return kernels::make_cpu_backend(threads);
}

// A host tensor that owns its memory, filled from floats (rounded to its dtype).
struct Host {
  OwnedTensor o;
  Host(Shape s, DType t, const std::vector<float>& v = {}) {
    o.ensure(s, t, Device{});
    if (!v.empty()) set(v);
  }
  void set(const std::vector<float>& v) {
    static const auto caster = backend();
    Tensor src(const_cast<float*>(v.data()), o.view.shape, DType::f32);
    caster->cast(src, o.view);
  }
  const Tensor& t() const { return o.view; }
  const Tensor* p() const { return &o.view; }
  std::vector<float> get() const { return copy_of(o.view); }
};

// Round floats through a 16-bit dtype (so fp32 and 16-bit runs see the same inputs).
std::vector<float> rounded(const std::vector<float>& v, DType t) {
  Host h({int64_t(v.size())}, t, v);
  return h.get();
}

double weighted(const std::vector<float>& y, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += double(y[i]) * r[i];
  return s;
}

// Central differences of loss() in v[i] against grad[i], for a spread of indices.
void check_fd(const std::string& what, std::vector<float>& v, const std::vector<float>& grad,
              const std::function<double()>& loss, float eps = 1e-2f, size_t max_checks = 60) {
  const size_t step = std::max<size_t>(1, v.size() / max_checks);
  for (size_t i = 0; i < v.size(); i += step) {
    const float keep = v[i];
    v[i] = keep + eps;
    const double up = loss();
    v[i] = keep - eps;
    const double down = loss();
    v[i] = keep;
    const double fd = (up - down) / (2.0 * eps);
    EXPECT_TRUE(close(grad[i], fd, kRtol, kAtol))
        << what << " at index " << i << ": backward " << grad[i] << ", finite difference " << fd;
  }
}

// ---- attention ------------------------------------------------------------------------------

struct AttnCase {
  int64_t b, t, heads, hs;
};
std::string name_of(const AttnCase& c) {
  return cat("B", c.b, "_T", c.t, "_H", c.heads, "_hs", c.hs);
}

// Naive causal attention in double: out, lse, and dqkv for dout.
struct NaiveAttention {
  std::vector<double> out, lse, dqkv;
};
NaiveAttention naive_attention(const AttnCase& c, const std::vector<float>& qkv,
                               const std::vector<float>& dout) {
  const int64_t C = c.heads * c.hs, T = c.t;
  NaiveAttention r;
  r.out.assign(size_t(c.b * T * C), 0);
  r.lse.assign(size_t(c.b * c.heads * T), 0);
  r.dqkv.assign(qkv.size(), 0);
  const double scale = 1.0 / std::sqrt(double(c.hs));
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t d) {
    return size_t((b * T + t) * 3 * C + part * C + h * c.hs + d);
  };
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(size_t(i + 1)), p(size_t(i + 1)), dp(size_t(i + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < c.hs; ++d)
            acc += double(qkv[at(b, i, 0, h, d)]) * qkv[at(b, j, 1, h, d)];
          s[size_t(j)] = acc * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[size_t(j)] - mx);
        r.lse[size_t((b * c.heads + h) * T + i)] = mx + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) p[size_t(j)] = std::exp(s[size_t(j)] - mx) / sum;
        const size_t o = size_t((b * T + i) * C + h * c.hs);
        for (int64_t d = 0; d < c.hs; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += p[size_t(j)] * qkv[at(b, j, 2, h, d)];
          r.out[o + size_t(d)] = acc;
        }
        // backward of this query row
        double delta = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < c.hs; ++d)
            acc += double(dout[o + size_t(d)]) * qkv[at(b, j, 2, h, d)];
          dp[size_t(j)] = acc;
          delta += p[size_t(j)] * acc;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[size_t(j)] * (dp[size_t(j)] - delta) * scale;
          for (int64_t d = 0; d < c.hs; ++d) {
            r.dqkv[at(b, i, 0, h, d)] += ds * qkv[at(b, j, 1, h, d)];
            r.dqkv[at(b, j, 1, h, d)] += ds * qkv[at(b, i, 0, h, d)];
            r.dqkv[at(b, j, 2, h, d)] += p[size_t(j)] * dout[o + size_t(d)];
          }
        }
      }
  return r;
}

double rel_err_d(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::fabs(double(got[i]) - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return num / den;
}

struct AttnRun {
  std::vector<float> out, lse, dqkv;
};
AttnRun run_attention(kernels::Backend& be, const AttnCase& c, DType t,
                      const std::vector<float>& qkv, const std::vector<float>& dout,
                      bool with_backward = true) {
  const int64_t C = c.heads * c.hs;
  Host x({c.b, c.t, 3 * C}, t, qkv), y({c.b, c.t, C}, t), lse({c.b, c.heads, c.t}, DType::f32);
  be.attention_forward(c.heads, x.t(), y.t(), lse.t());
  AttnRun r{y.get(), lse.get(), {}};
  if (with_backward) {
    Host dy({c.b, c.t, C}, t, dout), dx({c.b, c.t, 3 * C}, t);
    be.attention_backward(c.heads, x.t(), y.t(), dy.t(), lse.t(), dx.t());
    r.dqkv = dx.get();
  }
  return r;
}

class Attention : public ::testing::TestWithParam<AttnCase> {};

// Every CPU attention path, whatever this CPU's default: oneDNN tile GEMMs, and the tile
// kernels in their AVX-512 build (where the CPU has it) and their baseline x86-64 build.
std::vector<std::pair<std::string, std::unique_ptr<kernels::Backend>>> all_paths(int threads) {
  using Path = kernels::cpu::CpuOptions::AttentionPath;
  std::vector<std::pair<std::string, std::unique_ptr<kernels::Backend>>> v;
  const auto add = [&](const std::string& name, Path path, bool avx512) {
    kernels::cpu::CpuOptions o = kernels::cpu::CpuOptions::from_env();
    o.attention = path;
    o.attention_avx512 = avx512;
    v.emplace_back(name, std::make_unique<kernels::cpu::CpuBackend>(threads, o));
  };
  add("oneDNN tile GEMMs", Path::gemm, true);
  add("tile kernels, AVX-512 where available", Path::tile_kernels, true);
  add("tile kernels, baseline x86-64", Path::tile_kernels, false);
  return v;
}

TEST_P(Attention, MatchesNaiveReferenceInFp32) {
  const AttnCase c = GetParam();
  const int64_t C = c.heads * c.hs;
  const auto qkv = uniform_floats(size_t(c.b * c.t * 3 * C), -2.f, 2.f, 11);
  const auto dout = uniform_floats(size_t(c.b * c.t * C), -1.f, 1.f, 12);
  const NaiveAttention ref = naive_attention(c, qkv, dout);
  for (auto& [path, be] : all_paths(1)) {
    const AttnRun r = run_attention(*be, c, DType::f32, qkv, dout);
    EXPECT_LE(rel_err_d(r.out, ref.out), 2e-6) << path << " output";
    EXPECT_LE(rel_err_d(r.lse, ref.lse), 2e-6) << path << " log-sum-exp";
    EXPECT_LE(rel_err_d(r.dqkv, ref.dqkv), 1e-5) << path << " dqkv";
  }
}

TEST_P(Attention, BackwardMatchesFiniteDifferences) {
  const AttnCase c = GetParam();
  const int64_t C = c.heads * c.hs;
  auto qkv = uniform_floats(size_t(c.b * c.t * 3 * C), -1.f, 1.f, 21);
  const auto r = uniform_floats(size_t(c.b * c.t * C), -1.f, 1.f, 22);
  for (auto& [path, be] : all_paths(1)) {
    SCOPED_TRACE(path);
    const AttnRun run = run_attention(*be, c, DType::f32, qkv, r);
    check_fd("dqkv", qkv, run.dqkv,
             [&] { return weighted(run_attention(*be, c, DType::f32, qkv, r, false).out, r); });
  }
}

TEST_P(Attention, SixteenBitCloseToFp32) {
  const AttnCase c = GetParam();
  const int64_t C = c.heads * c.hs;
  for (auto& [path, be] : all_paths(1))
    for (DType t : {DType::bf16, DType::f16}) {
      const auto qkv = rounded(uniform_floats(size_t(c.b * c.t * 3 * C), -2.f, 2.f, 31), t);
      const auto dout = rounded(uniform_floats(size_t(c.b * c.t * C), -1.f, 1.f, 32), t);
      const AttnRun ref = run_attention(*be, c, DType::f32, qkv, dout);
      const AttnRun got = run_attention(*be, c, t, qkv, dout);
      // One rounding of each result, plus the rounded output feeding backward's delta term
      // (and, where the GEMMs run natively on 16-bit inputs, the rounded P and dS).
      const double tol = t == DType::bf16 ? 1.6e-2 : 2e-3;
      EXPECT_LE(rel_err(got.out, ref.out), tol) << path << " " << dtype_name(t) << " output";
      EXPECT_LE(rel_err(got.lse, ref.lse), 1e-6)
          << path << " " << dtype_name(t) << " lse (fp32 statistics)";
      EXPECT_LE(rel_err(got.dqkv, ref.dqkv), 2 * tol) << path << " " << dtype_name(t) << " dqkv";
    }
}

TEST_P(Attention, ThreadCountDoesNotChangeBits) {
  const AttnCase c = GetParam();
  const int64_t C = c.heads * c.hs;
  const auto qkv = uniform_floats(size_t(c.b * c.t * 3 * C), -2.f, 2.f, 41);
  const auto dout = uniform_floats(size_t(c.b * c.t * C), -1.f, 1.f, 42);
  auto ones = all_paths(1), twos = all_paths(2);
  for (size_t k = 0; k < ones.size(); ++k) {
    const std::string& path = ones[k].first;
    const AttnRun a = run_attention(*ones[k].second, c, DType::f32, qkv, dout);
    const AttnRun b = run_attention(*twos[k].second, c, DType::f32, qkv, dout);
    // Again on 2 threads: heads computed concurrently must not share scratch memory.
    const AttnRun b2 = run_attention(*twos[k].second, c, DType::f32, qkv, dout);
    EXPECT_EQ(b.out, b2.out) << path << ", 2 threads, second run";
    EXPECT_EQ(b.dqkv, b2.dqkv) << path << ", 2 threads, second run";
    EXPECT_EQ(a.out, b.out) << path;
    EXPECT_EQ(a.dqkv, b.dqkv) << path;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Attention,
                         ::testing::Values(AttnCase{1, 1, 1, 8},    // one token
                                           AttnCase{2, 5, 1, 4},    // one head, short
                                           AttnCase{1, 70, 2, 8},   // T not a multiple of 64
                                           AttnCase{2, 64, 2, 16},  // exactly one tile
                                           AttnCase{1, 130, 3, 8},  // three tiles, last partial
                                           AttnCase{2, 200, 4, 32},
                                           // head sizes around the 16-float vectors of the
                                           // tile kernels: a vector and a part, four vectors
                                           // (gpt2-124m), one float, more than 64 columns
                                           AttnCase{1, 65, 1, 24},  // T one past the tile
                                           AttnCase{1, 130, 2, 64}, AttnCase{2, 33, 3, 1},
                                           AttnCase{1, 80, 1, 80}),
                         [](const auto& info) { return name_of(info.param); });

TEST(AttentionMask, FutureTokensDoNotReachThePast) {
  const AttnCase c{2, 100, 2, 8};
  const int64_t C = c.heads * c.hs, t0 = 67;
  auto qkv = uniform_floats(size_t(c.b * c.t * 3 * C), -2.f, 2.f, 51);
  std::vector<float> dout(size_t(c.b * c.t * C), 0.f);  // a loss on positions <= t0 only
  const auto r = uniform_floats(dout.size(), -1.f, 1.f, 52);
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t i = 0; i <= t0; ++i)
      for (int64_t d = 0; d < C; ++d)
        dout[size_t((b * c.t + i) * C + d)] = r[size_t((b * c.t + i) * C + d)];
  auto be = backend();
  const AttnRun before = run_attention(*be, c, DType::f32, qkv, dout);
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t i = t0 + 1; i < c.t; ++i)
      for (int64_t d = 0; d < 3 * C; ++d) qkv[size_t((b * c.t + i) * 3 * C + d)] += 3.f;
  const AttnRun after = run_attention(*be, c, DType::f32, qkv, dout);
  size_t changed_future = 0;
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t i = 0; i < c.t; ++i)
      for (int64_t d = 0; d < C; ++d) {
        const size_t k = size_t((b * c.t + i) * C + d);
        if (i <= t0)
          ASSERT_EQ(before.out[k], after.out[k]) << "output at token " << i << " changed";
        else
          changed_future += before.out[k] != after.out[k];
      }
  EXPECT_GT(changed_future, 0u) << "the perturbation changed nothing at all";
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t i = t0 + 1; i < c.t; ++i)
      for (int64_t d = 0; d < 3 * C; ++d)
        ASSERT_EQ(after.dqkv[size_t((b * c.t + i) * 3 * C + d)], 0.f)
            << "gradient reached future token " << i;
}

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
