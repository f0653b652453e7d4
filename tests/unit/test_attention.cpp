// Unit tests of the CPU backend's causal self-attention (kernels/cpu/cpu_attention.cpp,
// attention_tiles.cpp, cpu_attention_gemm.cpp):
//  - against a naive double-precision reference (forward, log-sum-exp, backward) with T
//    below, at and not a multiple of the tile, one head, one token;
//  - the causal mask: perturbing future tokens leaves earlier outputs bitwise unchanged and
//    earlier losses send no gradient to future tokens;
//  - the backward against central finite differences in fp32, fp16/bf16 inputs against fp32
//    on the same (rounded) inputs, and 1 vs 2 threads bitwise;
//  - on every CPU path: oneDNN tile GEMMs and the tile kernels (AVX-512 and baseline builds).
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
using test::Host;
using test::rel_err;
using test::rel_err_d;
using test::rounded;
using test::uniform_floats;
using test::weighted;

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

}  // namespace
}  // namespace ringtrain
