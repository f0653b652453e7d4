// Unit tests of the optimizers (nn/optimizer.hpp, kernels/cpu/cpu_optim.cpp) against a
// double-precision transcription of PyTorch's SGD and AdamW, with and without a 16-bit
// working copy; the loss scaler's unscale folded into the optimizer's gradient read (bitwise
// the separate pass's result); and of the gradient kernels unscale_check and sum_squares.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/kernels.hpp"
#include "nn/optimizer.hpp"
#include "test_util.hpp"

namespace ringtrain {
namespace {

using test::close;
using test::throws_kind;
using test::uniform_floats;

uint16_t narrow(float v, DType t) { return t == DType::f16 ? float_to_half(v) : float_to_bf16(v); }
float widen(uint16_t v, DType t) { return t == DType::f16 ? half_to_float(v) : bf16_to_float(v); }

// PyTorch's update rules in double: SGD with dampening 0, AdamW with decoupled decay.
struct Reference {
  OptimizerConfig cfg;
  std::vector<double> p, buf, m, v;
  int64_t t = 0;

  void step(const std::vector<float>& g, double lr) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      if (cfg.name == "sgd") {
        double d = g[i] + double(cfg.weight_decay) * p[i];
        if (cfg.momentum != 0.f) {
          buf[i] = double(cfg.momentum) * buf[i] + d;
          d = cfg.nesterov ? d + double(cfg.momentum) * buf[i] : buf[i];
        }
        p[i] -= lr * d;
      } else {
        const double b1 = cfg.beta1, b2 = cfg.beta2;
        p[i] *= 1 - lr * double(cfg.weight_decay);
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * double(g[i]) * g[i];
        const double bc1 = 1 - std::pow(b1, double(t)), bc2 = 1 - std::pow(b2, double(t));
        p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + double(cfg.eps));
      }
    }
  }
};

struct OptCase {
  std::string label;
  OptimizerConfig cfg;
};

OptCase sgd_case(std::string label, float momentum, bool nesterov, float wd) {
  OptimizerConfig c;
  c.name = "sgd";
  c.lr = 0.1f;
  c.momentum = momentum;
  c.nesterov = nesterov;
  c.weight_decay = wd;
  return {std::move(label), c};
}

OptCase adamw_case(std::string label, float wd) {
  OptimizerConfig c;
  c.name = "adamw";
  c.lr = 0.01f;
  c.weight_decay = wd;
  return {std::move(label), c};
}

// fp32 against double: a few ulps of the largest terms (|buf| reaches ~5 in 5 steps). An
// absolute bound, because buf = m*buf + d can cancel to far below its terms.
constexpr double kAtol = 2e-6;

void PrintTo(const OptCase& c, std::ostream* os) { *os << c.label; }

// (case, working-copy dtype or f32 for none, threads)
class OptimizerSteps : public ::testing::TestWithParam<std::tuple<OptCase, DType, int>> {};

TEST_P(OptimizerSteps, MatchPyTorchFormulas) {
  const auto& [oc, work_dt, threads] = GetParam();
  const bool with_work = work_dt != DType::f32;
  constexpr int64_t n = 40'003;  // several parallel chunks with 2 threads, odd tail
  auto be = kernels::make_cpu_backend(threads);
  auto opt = make_optimizer(oc.cfg, n);
  ASSERT_STREQ(opt->name(), oc.cfg.name.c_str());

  std::vector<float> p = uniform_floats(size_t(n), -1.f, 1.f, 61);
  Reference ref{oc.cfg, std::vector<double>(p.begin(), p.end()), std::vector<double>(size_t(n)),
                std::vector<double>(size_t(n)), std::vector<double>(size_t(n))};
  std::vector<uint16_t> work(static_cast<size_t>(n));
  const Tensor master(p.data(), {n}, DType::f32), work_t(work.data(), {n}, work_dt);

  for (int s = 0; s < 5; ++s) {
    SCOPED_TRACE(testing::Message() << "step " << s + 1);
    std::vector<float> g = uniform_floats(size_t(n), -1.f, 1.f, 70 + uint32_t(s));
    g[0] = 0.f;  // a parameter without gradient still decays
    const float lr = oc.cfg.lr * (1.f - 0.1f * float(s));  // the per-step lr argument is used
    opt->step(*be, master, Tensor(g.data(), {n}, DType::f32), with_work ? &work_t : nullptr, lr);
    ref.step(g, lr);
    EXPECT_EQ(opt->steps(), s + 1);

    for (int64_t i = 0; i < n; ++i)
      ASSERT_TRUE(close(p[size_t(i)], ref.p[size_t(i)], 1e-5, kAtol))
          << "param at index " << i << ": got " << p[size_t(i)] << ", reference "
          << ref.p[size_t(i)];
    // The optimizer state, by name.
    const auto& names = opt->state_names();
    for (size_t k = 0; k < names.size(); ++k) {
      const std::vector<double>& want = names[k] == "momentum"  ? ref.buf
                                        : names[k] == "exp_avg" ? ref.m
                                                                : ref.v;
      const float* got = opt->state(k).as<float>();
      for (int64_t i = 0; i < n; ++i)
        ASSERT_TRUE(close(got[i], want[size_t(i)], 1e-5, kAtol))
            << names[k] << " at index " << i << ": got " << got[i] << ", reference "
            << want[size_t(i)];
    }
    if (with_work) {
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(narrow(p[size_t(i)], work_dt), work[size_t(i)])
            << "working copy at index " << i << " is not the cast of the master " << p[size_t(i)];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OptimizerSteps,
    ::testing::Combine(::testing::Values(sgd_case("sgd_plain", 0.f, false, 0.f),
                                         sgd_case("sgd_plain_wd", 0.f, false, 0.05f),
                                         sgd_case("sgd_momentum", 0.9f, false, 0.f),
                                         sgd_case("sgd_momentum_wd", 0.9f, false, 0.05f),
                                         sgd_case("sgd_nesterov_wd", 0.9f, true, 0.05f),
                                         adamw_case("adamw", 0.f), adamw_case("adamw_wd", 0.1f)),
                       ::testing::Values(DType::f32, DType::f16, DType::bf16),
                       ::testing::Values(1, 2)),
    [](const auto& info) {
      const DType w = std::get<1>(info.param);
      return std::get<0>(info.param).label + "_work_" +
             (w == DType::f32 ? std::string("none") : std::string(dtype_name(w))) + "_threads" +
             std::to_string(std::get<2>(info.param));
    });

TEST(Optimizer, StateNames) {
  EXPECT_EQ(make_optimizer(sgd_case("", 0.9f, false, 0.f).cfg, 4)->state_names(),
            std::vector<std::string>{"momentum"});
  EXPECT_TRUE(make_optimizer(sgd_case("", 0.f, false, 0.f).cfg, 4)->state_names().empty());
  EXPECT_EQ(make_optimizer(adamw_case("", 0.f).cfg, 4)->state_names(),
            (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
}

TEST(Optimizer, BadConfigsAreInputErrors) {
  auto make = [](auto change) {
    return [change] {
      OptimizerConfig c;
      change(c);
      make_optimizer(c, 4);
    };
  };
  const auto input = ErrorKind::input;
  EXPECT_TRUE(throws_kind(make([](auto& c) { c.name = "lamb"; }), input));
  EXPECT_TRUE(throws_kind(make([](auto& c) { c.lr = 0.f; }), input));
  EXPECT_TRUE(throws_kind(make([](auto& c) { c.weight_decay = -1.f; }), input));
  EXPECT_TRUE(throws_kind(make([](auto& c) { c.beta1 = 1.f; }), input));
  EXPECT_TRUE(throws_kind(make([](auto& c) { c.beta2 = -0.1f; }), input));
  EXPECT_TRUE(throws_kind(make([](auto& c) {
                            c.name = "sgd";
                            c.momentum = 1.f;
                          }),
                          input));
}

// ---- the unscale in the optimizer's gradient read --------------------------------------

// The fp32 update rules in float, in the kernels' order of operations (each one correctly
// rounded: this file is compiled without FMA contraction, for baseline x86-64).
void float_step(const OptimizerConfig& c, float lr, int64_t t, float g, float& p, float& s0,
                float& s1) {
  if (c.name == "sgd") {
    const float d = g + c.weight_decay * p;
    if (c.momentum == 0.f) {
      p -= lr * d;
    } else if (c.nesterov) {
      s0 = c.momentum * s0 + d;
      p -= lr * (d + c.momentum * s0);
    } else {
      s0 = c.momentum * s0 + d;
      p -= lr * s0;
    }
    return;
  }
  const float bc1 = 1.f - float(std::pow(double(c.beta1), double(t)));
  const float bc2 = 1.f - float(std::pow(double(c.beta2), double(t)));
  const float step_size = lr / bc1, bc2_sqrt = std::sqrt(bc2);
  const float decay = 1.f - lr * c.weight_decay;
  s0 = c.beta1 * s0 + (1.f - c.beta1) * g;
  s1 = c.beta2 * s1 + (1.f - c.beta2) * g * g;
  p = p * decay - step_size * s0 / (std::sqrt(s1) / bc2_sqrt + c.eps);
}

// (case, gradient dtype, threads)
class FusedUnscale : public ::testing::TestWithParam<std::tuple<OptCase, DType, int>> {};

// Steps that read the summed gradient (any float dtype) times the unscale factor give the
// bits of the separate pass (unscale_check into fp32, then the step with factor 1), and the
// bits of the update rules in float: the vector kernels (AVX-512 where the CPU has it) do
// exactly the source's operations, fused into none.
TEST_P(FusedUnscale, BitwiseTheSeparatePassAndTheFloatRules) {
  const auto& [oc, grad_dt, threads] = GetParam();
  constexpr int64_t n = 40'003;
  const float factor = 1.f / (3.f * 1024.f);  // inexact: every product is rounded
  auto be = kernels::make_cpu_backend(threads);
  auto fused = make_optimizer(oc.cfg, n), separate = make_optimizer(oc.cfg, n);
  const std::vector<float> p0 = uniform_floats(size_t(n), -1.f, 1.f, 62);
  std::vector<float> pf = p0, ps = p0, pr = p0;
  const auto count = static_cast<size_t>(n);
  std::vector<float> r0(count), r1(count);
  std::vector<uint16_t> wf(count), ws(count);
  const Tensor work_f(wf.data(), {n}, DType::bf16), work_s(ws.data(), {n}, DType::bf16);
  for (int s = 0; s < 3; ++s) {
    SCOPED_TRACE(testing::Message() << "step " << s + 1);
    // The sums as the allreduce leaves them: scaled up, in the wire dtype.
    std::vector<float> g32 = uniform_floats(size_t(n), -3000.f, 3000.f, 90 + uint32_t(s));
    std::vector<uint16_t> g16(count);
    if (grad_dt != DType::f32)
      for (int64_t i = 0; i < n; ++i) g16[size_t(i)] = narrow(g32[size_t(i)], grad_dt);
    const Tensor sums(grad_dt == DType::f32 ? static_cast<void*>(g32.data()) : g16.data(), {n},
                      grad_dt);
    const float lr = oc.cfg.lr * (1.f - 0.1f * float(s));
    ASSERT_FALSE(be->unscale_check(sums, factor, Tensor()));
    fused->step(*be, Tensor(pf.data(), {n}, DType::f32), sums, &work_f, lr, factor);
    std::vector<float> unscaled(count);
    ASSERT_FALSE(be->unscale_check(sums, factor, Tensor(unscaled.data(), {n}, DType::f32)));
    separate->step(*be, Tensor(ps.data(), {n}, DType::f32),
                   Tensor(unscaled.data(), {n}, DType::f32), &work_s, lr);
    for (int64_t i = 0; i < n; ++i)
      float_step(oc.cfg, lr, s + 1, unscaled[size_t(i)], pr[size_t(i)], r0[size_t(i)],
                 r1[size_t(i)]);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(pf[size_t(i)]), std::bit_cast<uint32_t>(ps[size_t(i)]))
          << "param at index " << i << ": fused " << pf[size_t(i)] << ", separate "
          << ps[size_t(i)];
      ASSERT_EQ(std::bit_cast<uint32_t>(pf[size_t(i)]), std::bit_cast<uint32_t>(pr[size_t(i)]))
          << "param at index " << i << ": kernel " << pf[size_t(i)] << ", float rules "
          << pr[size_t(i)];
    }
    ASSERT_EQ(wf, ws) << "working copies differ";
    for (size_t k = 0; k < fused->state_names().size(); ++k) {
      const float* a = fused->state(k).as<float>();
      const float* b = separate->state(k).as<float>();
      const std::vector<float>& r = k == 0 ? r0 : r1;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i]))
            << fused->state_names()[k] << " at index " << i;
        ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(r[size_t(i)]))
            << fused->state_names()[k] << " at index " << i << " against the float rules";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FusedUnscale,
    ::testing::Combine(::testing::Values(sgd_case("sgd_plain_wd", 0.f, false, 0.05f),
                                         sgd_case("sgd_momentum_wd", 0.9f, false, 0.05f),
                                         sgd_case("sgd_nesterov_wd", 0.9f, true, 0.05f),
                                         adamw_case("adamw_wd", 0.1f)),
                       ::testing::Values(DType::f32, DType::f16, DType::bf16),
                       ::testing::Values(1, 2)),
    [](const auto& info) {
      return std::get<0>(info.param).label + "_grad_" + dtype_name(std::get<1>(info.param)) +
             "_threads" + std::to_string(std::get<2>(info.param));
    });

// ---- unscale_check ---------------------------------------------------------------------

class UnscaleCheck : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(UnscaleCheck, ScalesAndFindsNonFinite) {
  const auto [dt, threads] = GetParam();
  auto be = kernels::make_cpu_backend(threads);
  constexpr int64_t n = 40'007;
  const float factor = 1.f / 1024.f;
  const auto vals = uniform_floats(size_t(n), -3000.f, 3000.f, 81);
  // The input in its dtype; `raw` holds the storage, `in_f32` the values it stands for.
  std::vector<float> in32 = vals;
  std::vector<uint16_t> in16(static_cast<size_t>(n));
  if (dt != DType::f32)
    for (int64_t i = 0; i < n; ++i) in16[size_t(i)] = narrow(vals[size_t(i)], dt);
  auto value = [&](int64_t i) {
    return dt == DType::f32 ? in32[size_t(i)] : widen(in16[size_t(i)], dt);
  };
  const Tensor in(dt == DType::f32 ? static_cast<void*>(in32.data()) : in16.data(), {n}, dt);
  std::vector<float> out(static_cast<size_t>(n));
  const Tensor out_t(out.data(), {n}, DType::f32);

  EXPECT_FALSE(be->unscale_check(in, factor, out_t));
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(value(i) * factor), std::bit_cast<uint32_t>(out[size_t(i)]))
        << "at index " << i;

  // One bad element anywhere is found: inf at the end, -inf in the middle, nan at the start.
  const uint16_t inf16 = dt == DType::f16 ? 0x7c00u : 0x7f80u;
  const uint16_t nan16 = dt == DType::f16 ? 0x7e00u : 0x7fc0u;
  for (auto [at, kind] : {std::pair{n - 1, 0}, std::pair{n / 2, 1}, std::pair{int64_t(0), 2}}) {
    const float bad = kind == 0 ? INFINITY : kind == 1 ? -INFINITY : NAN;
    const float keep32 = in32[size_t(at)];
    const uint16_t keep16 = in16[size_t(at)];
    in32[size_t(at)] = bad;
    in16[size_t(at)] = kind == 2 ? nan16 : uint16_t(inf16 | (kind == 1 ? 0x8000u : 0u));
    EXPECT_TRUE(be->unscale_check(in, factor, out_t)) << "non-finite at index " << at;
    EXPECT_TRUE(be->unscale_check(in, factor, Tensor())) << "check only, index " << at;
    in32[size_t(at)] = keep32;
    in16[size_t(at)] = keep16;
  }
  EXPECT_FALSE(be->unscale_check(in, factor, out_t));
  EXPECT_FALSE(be->unscale_check(in, factor, Tensor()));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, UnscaleCheck,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_threads" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(UnscaleCheck, InPlaceAndOverflowByFactor) {
  auto be = kernels::make_cpu_backend(1);
  std::vector<float> v = {1.f, -2.f, 3e38f, 4.f, 5.f};
  const Tensor t(v.data(), {5}, DType::f32);
  EXPECT_FALSE(be->unscale_check(t, 0.5f, t));
  EXPECT_EQ(v, (std::vector<float>{0.5f, -1.f, 1.5e38f, 2.f, 2.5f}));
  // Finite inputs whose product overflows count as non-finite too, in the read-only check
  // (which writes nothing) as in the pass that writes.
  EXPECT_FALSE(be->unscale_check(t, 2.f, Tensor()));
  EXPECT_TRUE(be->unscale_check(t, 4.f, Tensor()));
  EXPECT_EQ(v, (std::vector<float>{0.5f, -1.f, 1.5e38f, 2.f, 2.5f}));
  EXPECT_TRUE(be->unscale_check(t, 4.f, t));
  EXPECT_TRUE(std::isinf(v[2]));
}

// ---- sum_squares -----------------------------------------------------------------------

TEST(SumSquares, MatchesDoubleAndIsIndependentOfThreads) {
  auto be1 = kernels::make_cpu_backend(1);
  auto be2 = kernels::make_cpu_backend(2);
  for (int64_t n : {int64_t(5), int64_t(16'384), int64_t(1'000'003)}) {
    SCOPED_TRACE(testing::Message() << "n " << n);
    // Magnitudes from 2^-20 to 2^20, so the order of the additions shows in the last bits.
    std::vector<float> v = uniform_floats(size_t(n), -1.f, 1.f, uint32_t(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(v[i], int(i * 7919 % 41) - 20);
    const Tensor t(v.data(), {n}, DType::f32);
    double want = 0;
    for (float x : v) want += double(x) * double(x);
    const double s1 = be1->sum_squares(t);
    const double s2 = be2->sum_squares(t);
    EXPECT_NEAR(s1, want, 1e-10 * want);  // n * 2^-53 bounds the relative error
    EXPECT_EQ(std::bit_cast<uint64_t>(s1), std::bit_cast<uint64_t>(s2))
        << "1 thread gives " << s1 << ", 2 threads " << s2;
  }
  std::vector<float> small = {1.f, -2.f, 3.f};
  EXPECT_EQ(be1->sum_squares(Tensor(small.data(), {3}, DType::f32)), 14.0);
}

}  // namespace
}  // namespace ringtrain
