// Every op of the CUDA backend against the CPU reference on the same inputs, with a per-op
// tolerance, for fp32, fp16 and bf16 and a small and a larger size (the style of ggml's
// test-backend-ops). Skipped, visibly, without a CUDA device.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "tests/gpu/gpu_util.hpp"

namespace ringtrain::test {
namespace {

using kernels::Activation;

class OpTest : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {
 protected:
  void SetUp() override { RT_NEED_GPU(); }
  DType dt() const { return std::get<0>(GetParam()); }
  int64_t size() const { return std::get<1>(GetParam()); }
  kernels::Backend& cpu() { return cpu_backend(); }
  kernels::Backend& gpu() { return gpu_backend(); }
};

TEST_P(OpTest, Gemm) {
  const int64_t m = size(), n = size() + 3, k = size() + 5;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (DType cdt : {dt(), DType::f32})
        for (float beta : {0.f, 0.5f}) {
          SCOPED_TRACE(::testing::Message()
                       << "trans " << ta << tb << " c " << dtype_name(cdt) << " beta " << beta);
          Pair a = make_pair(ta ? Shape{k, m} : Shape{m, k}, dt(), uniform(m * k, -1, 1, 1));
          Pair b = make_pair(tb ? Shape{n, k} : Shape{k, n}, dt(), uniform(k * n, -1, 1, 2));
          Pair c = make_pair({m, n}, cdt, uniform(m * n, -1, 1, 3));
          cpu().gemm(ta, tb, 0.75f, a.h(), b.h(), beta, c.h());
          gpu().gemm(ta, tb, 0.75f, a.d(), b.d(), beta, c.d());
          const auto want = floats(c.h());
          EXPECT_TRUE(all_close(floats(c.d()), want, rtol_of(cdt), 1e-5 * max_abs(want)));
        }
}

// Unit roundoff of a dtype: the largest relative error of rounding to it.
double unit_roundoff(DType t) {
  return t == DType::f32 ? 0x1p-24 : t == DType::f16 ? 0x1p-11 : 0x1p-8;
}

// Linear's backward through an fp32 last layer: fp32 dlogits (a) against 16-bit activations
// or weights (b). The GPU rounds a to b's dtype and runs on tensor cores (gemm_types.hpp);
// the CPU multiplies exactly in fp32. Per element the two differ by at most the rounding of
// a (u_in S, S = sum |a||b|), the two roundings of C (u_c |C| each) and fp32 accumulation in
// different orders (k 2^-23 S).
TEST_P(OpTest, GemmMixedInputs) {
  const int64_t m = size(), n = size() + 1, k = size() + 2;
  const auto av = uniform(m * k, -1, 1, 4), bv = uniform(k * n, -1, 1, 5);
  Pair a = make_pair({k, m}, DType::f32, av);
  Pair b = make_pair({k, n}, dt(), bv);
  Pair c = make_pair({m, n}, dt());
  cpu().gemm(true, false, 1.f, a.h(), b.h(), 0.f, c.h());
  gpu().gemm(true, false, 1.f, a.d(), b.d(), 0.f, c.d());
  // S = |a|^T |b| on the host, from b as rounded to its dtype.
  std::vector<float> aa(av.size()), ba = floats(b.h());
  for (size_t i = 0; i < av.size(); ++i) aa[i] = std::fabs(av[i]);
  for (auto& v : ba) v = std::fabs(v);
  Pair as = make_pair({k, m}, DType::f32, aa), bs = make_pair({k, n}, DType::f32, ba);
  Pair sum = make_pair({m, n}, DType::f32);
  cpu().gemm(true, false, 1.f, as.h(), bs.h(), 0.f, sum.h());
  const auto want = floats(c.h()), got = floats(c.d()), s_abs = floats(sum.h());
  const double u_in = unit_roundoff(dt()), u_c = unit_roundoff(dt());
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double bound = 1.01 * (u_in * s_abs[i] * (1 + u_c) + 2 * u_c * std::fabs(want[i]) +
                                 double(k) * 0x1p-23 * s_abs[i]);
    const double ratio = std::fabs(double(got[i]) - double(want[i])) / bound;
    if (!(ratio <= 1)) ++bad;
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  EXPECT_EQ(bad, 0u) << "worst at " << worst << ": gpu " << got[worst] << " cpu " << want[worst]
                     << " (" << worst_ratio << " x the bound)";
}

TEST_P(OpTest, Cast) {
  const int64_t n = size() * 97;
  auto v = uniform(n, -70000, 70000, 6);
  v[0] = 1e-8f;  // a subnormal in fp16
  for (DType to : {DType::f32, DType::f16, DType::bf16}) {
    Pair s = make_pair({n}, dt(), v), d1 = make_pair({n}, to);
    cpu().cast(s.h(), d1.h());
    gpu().cast(s.d(), d1.d());
    EXPECT_TRUE(all_close(floats(d1.d()), floats(d1.h()), 0, 0)) << "to " << dtype_name(to);
  }
}

TEST_P(OpTest, BiasAddAndActivation) {
  const int64_t rows = size(), f = 33;
  for (DType ydt : {dt(), DType::f32})
    for (Activation act : {Activation::none, Activation::relu}) {
      Pair y = make_pair({rows, f}, ydt, uniform(rows * f, -2, 2, 7));
      Pair b = make_pair({f}, dt(), uniform(f, -1, 1, 8));
      cpu().bias_add(y.h(), b.h(), act);
      gpu().bias_add(y.d(), b.d(), act);
      EXPECT_TRUE(all_close(floats(y.d()), floats(y.h()), 0, 0));
    }
}

TEST_P(OpTest, BiasGrad) {
  const int64_t rows = size() * 3, f = 17;
  Pair dy = make_pair({rows, f}, dt(), uniform(rows * f, -1, 1, 9));
  Pair db = make_pair({f}, dt());
  cpu().bias_grad(dy.h(), db.h());
  gpu().bias_grad(dy.d(), db.d());
  EXPECT_TRUE(all_close(floats(db.d()), floats(db.h()), rtol_of(dt()), 1e-5 * double(rows)));
  // A convolution's bias gradient, dy [n, k, p, q] summed over n, p and q (the per-channel
  // block reduction), with a row count that does not divide into the 32 slices.
  kernels::ConvShape cs;
  cs.n = size() / 2 + 3, cs.c = 2, cs.h = 9, cs.w = 11, cs.k = 19, cs.r = 3, cs.s = 3;
  cs.stride = 1, cs.pad = 1;
  const int64_t xn = cs.n * cs.c * cs.h * cs.w, yn = cs.n * cs.k * cs.p() * cs.q();
  Pair x = make_pair({cs.n, cs.c, cs.h, cs.w}, dt(), uniform(xn, -1, 1, 40));
  Pair cdy = make_pair({cs.n, cs.k, cs.p(), cs.q()}, dt(), uniform(yn, -1, 1, 41));
  Pair dw = make_pair({cs.k, cs.c, cs.r, cs.s}, dt()), cdb = make_pair({cs.k}, DType::f32);
  cpu().conv2d_backward_filter(cs, x.h(), cdy.h(), dw.h(), &cdb.h());
  gpu().conv2d_backward_filter(cs, x.d(), cdy.d(), dw.d(), &cdb.d());
  // fp32 sums of yn / k terms of size <= 1 in two orders.
  EXPECT_TRUE(all_close(floats(cdb.d()), floats(cdb.h()), 0, 1e-6 * double(yn / cs.k)));
}

TEST_P(OpTest, Relu) {
  const int64_t n = size() * 31;
  auto v = uniform(n, -1, 1, 10);
  v[1] = NAN;
  Pair x = make_pair({n}, dt(), v), y = make_pair({n}, dt());
  cpu().relu(x.h(), y.h());
  gpu().relu(x.d(), y.d());
  EXPECT_TRUE(all_close(floats(y.d()), floats(y.h()), 0, 0));
  Pair dy = make_pair({n}, dt(), uniform(n, -1, 1, 11)), dx = make_pair({n}, dt());
  cpu().relu_backward(y.h(), dy.h(), dx.h());
  gpu().relu_backward(y.d(), dy.d(), dx.d());
  EXPECT_TRUE(all_close(floats(dx.d()), floats(dx.h()), 0, 0));
}

TEST_P(OpTest, SoftmaxCrossEntropy) {
  const int64_t rows = size(), c = dt() == DType::f32 ? 10 : 1000;  // dtype picks the width
  Pair logits = make_pair({rows, c}, DType::f32, uniform(rows * c, -5, 5, 12));
  std::vector<float> lab(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) lab[size_t(r)] = float((r * 7) % c);
  Pair labels = make_pair({rows}, DType::i32, lab);
  Pair dl = make_pair({rows, c}, DType::f32);
  const auto want = cpu().softmax_xent(logits.h(), labels.h(), 256.f, &dl.h());
  const auto got = gpu().softmax_xent(logits.d(), labels.d(), 256.f, &dl.d());
  EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-9 * std::fabs(want.loss_sum));
  EXPECT_EQ(got.correct, want.correct);
  EXPECT_TRUE(all_close(floats(dl.d()), floats(dl.h()), 1e-6, 1e-9));
}

// Rows with NaN and infinite logits: the GPU counts a row correct exactly when the CPU does
// (the CPU's scan keeps index 0 when x[0] is NaN and otherwise skips NaNs). Each row's label
// is the CPU's arg-max, so any disagreement lowers the GPU's count.
TEST_P(OpTest, SoftmaxArgMaxWithNan) {
  const int64_t rows = size(), c = size() == 7 ? 10 : 300;
  auto v = uniform(rows * c, -5, 5, 13);
  for (int64_t r = 0; r < rows; ++r) {
    float* x = v.data() + r * c;
    for (int64_t j = r % 3; j < c; j += 7 + r % 5) x[j] = NAN;  // NaN in several lanes
    if (r % 4 == 1) x[0] = NAN;
    if (r % 6 == 2) x[(r * 11) % c] = INFINITY;
    x[(r * 13 + 1) % c] = 9.f;  // a maximum for NaNs to shadow
  }
  Pair logits = make_pair({rows, c}, DType::f32, v);
  std::vector<float> lab(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    Tensor row(logits.h().as<float>() + r * c, {1, c}, DType::f32);
    for (int32_t l = 0; l < c; ++l) {
      Tensor one(&l, {1}, DType::i32);
      if (cpu().softmax_xent(row, one, 1.f, nullptr).correct) lab[size_t(r)] = float(l);
    }
  }
  Pair labels = make_pair({rows}, DType::i32, lab);
  EXPECT_EQ(cpu().softmax_xent(logits.h(), labels.h(), 1.f, nullptr).correct, rows);
  EXPECT_EQ(gpu().softmax_xent(logits.d(), labels.d(), 1.f, nullptr).correct, rows);
}

TEST_P(OpTest, UnscaleCheckAndNonFinite) {
  const int64_t n = size() * 101;
  auto v = uniform(n, -1000, 1000, 13);
  Pair in = make_pair({n}, dt(), v), out = make_pair({n}, DType::f32);
  EXPECT_EQ(gpu().unscale_check(in.d(), 1.f / 1024, out.d()),
            cpu().unscale_check(in.h(), 1.f / 1024, out.h()));
  EXPECT_TRUE(all_close(floats(out.d()), floats(out.h()), 0, 0));
  EXPECT_FALSE(gpu().any_nonfinite(in.d()));
  v[size_t(n - 1)] = INFINITY;
  Pair bad = make_pair({n}, dt(), v);
  EXPECT_TRUE(gpu().unscale_check(bad.d(), 0.5f, out.d()));
  EXPECT_TRUE(gpu().any_nonfinite(bad.d()));
  v[size_t(n - 1)] = NAN;
  Pair nan = make_pair({n}, dt(), v);
  EXPECT_TRUE(gpu().any_nonfinite(nan.d()));
}

TEST_P(OpTest, SumSquaresAndScale) {
  const int64_t n = size() * 1000 + 3;
  Pair x = make_pair({n}, DType::f32, uniform(n, -1, 1, 14));
  const double want = cpu().sum_squares(x.h()), got = gpu().sum_squares(x.d());
  EXPECT_NEAR(got, want, 1e-12 * want);
  cpu().scale(x.h(), 0.3f);
  gpu().scale(x.d(), 0.3f);
  EXPECT_TRUE(all_close(floats(x.d()), floats(x.h()), 0, 0));
}

TEST_P(OpTest, SgdStepWritesWorkingCopy) {
  const int64_t n = size() * 300 + 1;
  for (int variant = 0; variant < 3; ++variant) {  // plain, momentum, Nesterov
    kernels::SgdConfig cfg{0.05f, variant ? 0.9f : 0.f, 1e-4f, variant == 2};
    Pair p = make_pair({n}, DType::f32, uniform(n, -1, 1, 15));
    Pair g = make_pair({n}, DType::f32, uniform(n, -1, 1, 16));
    Pair m = make_pair({n}, DType::f32, uniform(n, -0.1f, 0.1f, 17));
    Pair w = make_pair({n}, dt());
    for (int step = 0; step < 3; ++step) {
      cpu().sgd_step(cfg, p.h(), g.h(), variant ? &m.h() : nullptr, &w.h());
      gpu().sgd_step(cfg, p.d(), g.d(), variant ? &m.d() : nullptr, &w.d());
    }
    // Same formula, same rounding (nvcc --fmad=false): bit for bit.
    EXPECT_TRUE(all_close(floats(p.d()), floats(p.h()), 0, 0)) << "variant " << variant;
    EXPECT_TRUE(all_close(floats(m.d()), floats(m.h()), 0, 0)) << "variant " << variant;
    EXPECT_TRUE(all_close(floats(w.d()), floats(w.h()), 0, 0)) << "variant " << variant;
  }
}

TEST_P(OpTest, AdamwStepWritesWorkingCopy) {
  const int64_t n = size() * 300 + 1;
  kernels::AdamWConfig cfg;
  cfg.weight_decay = 0.01f;
  Pair p = make_pair({n}, DType::f32, uniform(n, -1, 1, 18));
  Pair g = make_pair({n}, DType::f32, uniform(n, -1, 1, 19));
  Pair m = make_pair({n}, DType::f32), v = make_pair({n}, DType::f32), w = make_pair({n}, dt());
  for (int step = 1; step <= 3; ++step) {
    cfg.step = step;
    cpu().adamw_step(cfg, p.h(), g.h(), m.h(), v.h(), &w.h());
    gpu().adamw_step(cfg, p.d(), g.d(), m.d(), v.d(), &w.d());
  }
  // 1 ulp of slack in case the host's sqrt/divide differ in a corner; usually exact.
  EXPECT_TRUE(all_close(floats(p.d()), floats(p.h()), 2e-7, 0));
  EXPECT_TRUE(all_close(floats(m.d()), floats(m.h()), 2e-7, 0));
  EXPECT_TRUE(all_close(floats(v.d()), floats(v.h()), 2e-7, 0));
  EXPECT_TRUE(all_close(floats(w.d()), floats(w.h()), rtol_of(dt()) / 4, 0));
}

TEST_P(OpTest, Conv2d) {
  const int64_t hw = size() < 16 ? 9 : 17;
  for (int64_t stride : {1, 2})
    for (int64_t pad : {0, 1}) {
      kernels::ConvShape cs;
      cs.n = 2, cs.c = 3, cs.h = hw, cs.w = hw + 2, cs.k = 5, cs.r = 3, cs.s = 3;
      cs.stride = stride, cs.pad = pad;
      SCOPED_TRACE(::testing::Message() << "stride " << stride << " pad " << pad);
      const int64_t xn = cs.n * cs.c * cs.h * cs.w, wn = cs.k * cs.c * cs.r * cs.s;
      const int64_t yn = cs.n * cs.k * cs.p() * cs.q();
      Pair x = make_pair({cs.n, cs.c, cs.h, cs.w}, dt(), uniform(xn, -1, 1, 20));
      Pair w = make_pair({cs.k, cs.c, cs.r, cs.s}, dt(), uniform(wn, -1, 1, 21));
      Pair b = make_pair({cs.k}, dt(), uniform(cs.k, -1, 1, 22));
      Pair y = make_pair({cs.n, cs.k, cs.p(), cs.q()}, dt());
      cpu().conv2d_forward(cs, x.h(), w.h(), &b.h(), Activation::relu, y.h());
      gpu().conv2d_forward(cs, x.d(), w.d(), &b.d(), Activation::relu, y.d());
      // 16-bit: cuDNN rounds the convolution, then the bias is added and rounded again.
      const double r = dt() == DType::f32 ? 1e-5 : 2 * rtol_of(dt());
      auto want = floats(y.h());
      EXPECT_TRUE(all_close(floats(y.d()), want, r, 1e-5 * max_abs(want) + r * 0.1));
      Pair dy = make_pair({cs.n, cs.k, cs.p(), cs.q()}, dt(), uniform(yn, -1, 1, 23));
      Pair dx = make_pair({cs.n, cs.c, cs.h, cs.w}, dt());
      cpu().conv2d_backward_data(cs, dy.h(), w.h(), dx.h());
      gpu().conv2d_backward_data(cs, dy.d(), w.d(), dx.d());
      want = floats(dx.h());
      EXPECT_TRUE(all_close(floats(dx.d()), want, r, 1e-5 * max_abs(want) + r * 0.1));
      Pair dw = make_pair({cs.k, cs.c, cs.r, cs.s}, dt()), db = make_pair({cs.k}, dt());
      cpu().conv2d_backward_filter(cs, x.h(), dy.h(), dw.h(), &db.h());
      gpu().conv2d_backward_filter(cs, x.d(), dy.d(), dw.d(), &db.d());
      want = floats(dw.h());
      EXPECT_TRUE(all_close(floats(dw.d()), want, r, 1e-5 * max_abs(want) + r * 0.1));
      want = floats(db.h());
      EXPECT_TRUE(all_close(floats(db.d()), want, r, 1e-5 * max_abs(want) + r * 0.1));
    }
}

TEST_P(OpTest, Pooling) {
  kernels::PoolShape ps;
  ps.n = 2, ps.c = 3, ps.h = size() < 16 ? 8 : 33, ps.w = ps.h + 1;
  for (int64_t k : {2, 3}) {
    ps.kernel = k, ps.stride = 2;  // k 3, stride 2: overlapping windows
    const int64_t xn = ps.n * ps.c * ps.h * ps.w, yn = ps.n * ps.c * ps.p() * ps.q();
    Pair x = make_pair({ps.n, ps.c, ps.h, ps.w}, dt(), uniform(xn, -1, 1, 24));
    Pair y = make_pair({ps.n, ps.c, ps.p(), ps.q()}, dt());
    Pair am = make_pair({ps.n, ps.c, ps.p(), ps.q()}, DType::i32);
    cpu().maxpool2d_forward(ps, x.h(), y.h(), am.h());
    gpu().maxpool2d_forward(ps, x.d(), y.d(), am.d());
    EXPECT_TRUE(all_close(floats(y.d()), floats(y.h()), 0, 0));
    EXPECT_TRUE(all_close(floats(am.d()), floats(am.h()), 0, 0));
    Pair dy = make_pair({ps.n, ps.c, ps.p(), ps.q()}, dt(), uniform(yn, -1, 1, 25));
    Pair dx = make_pair({ps.n, ps.c, ps.h, ps.w}, dt());
    cpu().maxpool2d_backward(ps, dy.h(), am.h(), dx.h());
    gpu().maxpool2d_backward(ps, dy.d(), am.d(), dx.d());
    EXPECT_TRUE(all_close(floats(dx.d()), floats(dx.h()), 0, 0));
  }
  const int64_t xn = ps.n * ps.c * ps.h * ps.w;
  Pair x = make_pair({ps.n, ps.c, ps.h, ps.w}, dt(), uniform(xn, -1, 1, 26));
  Pair y = make_pair({ps.n, ps.c}, dt());
  cpu().avgpool_global_forward(x.h(), y.h());
  gpu().avgpool_global_forward(x.d(), y.d());
  EXPECT_TRUE(all_close(floats(y.d()), floats(y.h()), 0, 0));
  Pair dy = make_pair({ps.n, ps.c}, dt(), uniform(ps.n * ps.c, -1, 1, 27));
  Pair dx = make_pair({ps.n, ps.c, ps.h, ps.w}, dt());
  cpu().avgpool_global_backward(dy.h(), dx.h());
  gpu().avgpool_global_backward(dy.d(), dx.d());
  EXPECT_TRUE(all_close(floats(dx.d()), floats(dx.h()), 0, 0));
}

TEST_P(OpTest, BatchNorm) {
  const int64_t n = 4, c = 3, hw = size() < 16 ? 5 : 16;
  const int64_t xn = n * c * hw * hw;
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "eval");
    Pair x = make_pair({n, c, hw, hw}, dt(), uniform(xn, -2, 3, 28));
    Pair g = make_pair({c}, DType::f32, uniform(c, 0.5f, 1.5f, 29));
    Pair b = make_pair({c}, DType::f32, uniform(c, -0.5f, 0.5f, 30));
    Pair rm = make_pair({c}, DType::f32, uniform(c, -0.1f, 0.1f, 31));
    Pair rv = make_pair({c}, DType::f32, uniform(c, 0.9f, 1.1f, 32));
    Pair y = make_pair({n, c, hw, hw}, dt()), mean = make_pair({c}, DType::f32);
    Pair inv = make_pair({c}, DType::f32);
    kernels::BatchNormConfig cfg;
    cpu().batchnorm_forward(cfg, training, x.h(), g.h(), b.h(), rm.h(), rv.h(), y.h(), mean.h(),
                            inv.h());
    gpu().batchnorm_forward(cfg, training, x.d(), g.d(), b.d(), rm.d(), rv.d(), y.d(), mean.d(),
                            inv.d());
    // Statistics in double (summed in another order): equal to fp32 rounding, or 1 ulp.
    EXPECT_TRUE(all_close(floats(mean.d()), floats(mean.h()), 1e-6, 1e-7));
    EXPECT_TRUE(all_close(floats(inv.d()), floats(inv.h()), 1e-6, 0));
    EXPECT_TRUE(all_close(floats(rm.d()), floats(rm.h()), 1e-6, 1e-7));
    EXPECT_TRUE(all_close(floats(rv.d()), floats(rv.h()), 1e-6, 0));
    EXPECT_TRUE(all_close(floats(y.d()), floats(y.h()), rtol_of(dt()) + 1e-5, 1e-5));
    Pair dy = make_pair({n, c, hw, hw}, dt(), uniform(xn, -1, 1, 33));
    Pair dx = make_pair({n, c, hw, hw}, dt()), dg = make_pair({c}, DType::f32);
    Pair dbt = make_pair({c}, DType::f32);
    cpu().batchnorm_backward(training, x.h(), dy.h(), g.h(), mean.h(), inv.h(), dx.h(), dg.h(),
                             dbt.h());
    gpu().batchnorm_backward(training, x.d(), dy.d(), g.d(), mean.d(), inv.d(), dx.d(), dg.d(),
                             dbt.d());
    EXPECT_TRUE(all_close(floats(dg.d()), floats(dg.h()), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(floats(dbt.d()), floats(dbt.h()), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(floats(dx.d()), floats(dx.h()), rtol_of(dt()) + 1e-5, 1e-4));
  }
}

// Every pointwise kernel of the CUDA table (the activation family) against the CPU's: both
// tables hold the same ops, and each runs forward and backward within the dtype's rounding
// (expf and erff differ from the CPU's by an ulp or two). Nothing here names an activation,
// so a new one is compared without a line in this test.
TEST_P(OpTest, TableActivations) {
  const std::vector<std::string> ops = gpu().kernel_table().unary_ops();
  EXPECT_EQ(ops, cpu().kernel_table().unary_ops());
  const int64_t n = size() * 211;
  Pair x = make_pair({n}, dt(), uniform(n, -8, 8, 37)),
       dy = make_pair({n}, dt(), uniform(n, -1, 1, 38));
  for (const std::string& op : ops) {
    SCOPED_TRACE(op);
    ASSERT_TRUE(gpu().supports(op, dt()));
    Pair y = make_pair({n}, dt()), dx = make_pair({n}, dt());
    cpu().unary(op, x.h(), y.h());
    gpu().unary(op, x.d(), y.d());
    EXPECT_TRUE(all_close(floats(y.d()), floats(y.h()), rtol_of(dt()) + 1e-5, 1e-6));
    cpu().unary_backward(op, x.h(), dy.h(), dx.h());
    gpu().unary_backward(op, x.d(), dy.d(), dx.d());
    EXPECT_TRUE(all_close(floats(dx.d()), floats(dx.h()), rtol_of(dt()) + 1e-5, 1e-6));
  }
}

TEST_P(OpTest, GeluDropoutAdd) {
  const int64_t n = size() * 211;
  Pair x = make_pair({n}, dt(), uniform(n, -4, 4, 34)), y = make_pair({n}, dt());
  cpu().gelu(x.h(), y.h());
  gpu().gelu(x.d(), y.d());
  // erff differs between glibc and CUDA by an ulp or two.
  EXPECT_TRUE(all_close(floats(y.d()), floats(y.h()), rtol_of(dt()) + 1e-6, 1e-6));
  Pair dy = make_pair({n}, dt(), uniform(n, -1, 1, 35)), dx = make_pair({n}, dt());
  cpu().gelu_backward(x.h(), dy.h(), dx.h());
  gpu().gelu_backward(x.d(), dy.d(), dx.d());
  EXPECT_TRUE(all_close(floats(dx.d()), floats(dx.h()), rtol_of(dt()) + 1e-6, 1e-6));

  Pair mask = make_pair({n}, DType::u8);
  cpu().dropout_forward(x.h(), 0.3f, 12345, y.h(), mask.h());
  gpu().dropout_forward(x.d(), 0.3f, 12345, y.d(), mask.d());
  EXPECT_TRUE(all_close(floats(mask.d()), floats(mask.h()), 0, 0)) << "masks must be identical";
  EXPECT_TRUE(all_close(floats(y.d()), floats(y.h()), 0, 0));
  cpu().dropout_backward(dy.h(), mask.h(), 0.3f, dx.h());
  gpu().dropout_backward(dy.d(), mask.d(), 0.3f, dx.d());
  EXPECT_TRUE(all_close(floats(dx.d()), floats(dx.h()), 0, 0));

  Pair a = make_pair({n}, dt(), uniform(n, -1, 1, 36)), s = make_pair({n}, dt());
  cpu().add(a.h(), x.h(), s.h());
  gpu().add(a.d(), x.d(), s.d());
  EXPECT_TRUE(all_close(floats(s.d()), floats(s.h()), 0, 0));
}

INSTANTIATE_TEST_SUITE_P(DtypeSize, OpTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Values(int64_t(7), int64_t(129))),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(GpuBackend, RejectsHostTensorsClearly) {
  RT_NEED_GPU();
  std::vector<float> host(4, 1.f);
  Tensor x(host.data(), {4}, DType::f32), y(host.data(), {4}, DType::f32);
  try {
    gpu_backend().relu(x, y);
    FAIL() << "a host tensor was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("host memory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ringtrain::test
