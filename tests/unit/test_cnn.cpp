// Unit tests of the convolutional layers (nn/layers.hpp) on the CPU backend:
//  - every layer's backward against central finite differences in fp32;
//  - fp16/bf16 forward and backward against fp32 within a stated tolerance;
//  - (against PyTorch: test_layer_ref.cpp)
//  - the fused ReLU, dropout's mask (rate, determinism), per-layer dtype overrides, and the
//    cnn/resnet models' shapes and parameter names.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "layer_test_util.hpp"
#include "nn/graph_builder.hpp"
#include "nn/layers.hpp"
#include "nn/model.hpp"
#include "test_util.hpp"

namespace ringtrain {
namespace {

using kernels::Activation;
using test::close;
using test::uniform_floats;

using test::copy_of;
using test::dot;
using test::OneLayer;
using test::rel_err;

constexpr double kRtol = 2e-2, kAtol = 2e-3;

void check_fd(const std::string& what, float* v, const std::vector<float>& grad,
              const std::function<double()>& loss, float eps) {
  int failures = 0;
  for (size_t i = 0; i < grad.size() && failures < 10; ++i) {
    const float keep = v[i];
    v[i] = keep + eps;
    const double lp = loss();
    v[i] = keep - eps;
    const double lm = loss();
    v[i] = keep;
    const double fd = (lp - lm) / (double(keep + eps) - double(keep - eps));
    if (!close(grad[i], fd, kRtol, kAtol)) {
      ADD_FAILURE() << what << " at index " << i << ": backward gives " << grad[i]
                    << ", finite difference " << fd;
      ++failures;
    }
  }
}

struct Case {
  std::string name;
  std::function<std::unique_ptr<Layer>()> make;
  Shape x;
  float lo = -1.f, hi = 1.f;  // input range
  bool distinct = false;      // inputs spaced apart (max pooling: no near-ties)
};

std::vector<float> make_input(const Case& c, uint32_t seed) {
  const size_t n = size_t(shape_numel(c.x));
  if (!c.distinct) return uniform_floats(n, c.lo, c.hi, seed);
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.f);
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  for (auto& x : v) x = x * 0.05f - float(n) * 0.025f;  // 0.05 apart, centred
  return v;
}

std::unique_ptr<Layer> conv(int64_t c, int64_t k, int64_t kern, int64_t stride, int64_t pad,
                            bool bias, Activation act = Activation::none) {
  return std::make_unique<Conv2D>("conv", Conv2D::Options{c, k, kern, stride, pad, bias, act});
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  cs.push_back({"conv3x3_s1_p1", [] { return conv(3, 4, 3, 1, 1, true); }, {2, 3, 6, 5}});
  cs.push_back({"conv3x3_s2_p0", [] { return conv(2, 3, 3, 2, 0, true); }, {2, 2, 7, 8}});
  cs.push_back({"conv1x1_s1", [] { return conv(4, 3, 1, 1, 0, false); }, {2, 4, 3, 3}});
  cs.push_back({"conv1x1_s2", [] { return conv(3, 2, 1, 2, 0, false); }, {2, 3, 5, 5}});
  cs.push_back({"conv5x5_s1_p2", [] { return conv(2, 2, 5, 1, 2, true); }, {1, 2, 6, 6}});
  cs.push_back({"maxpool2",
                [] { return std::make_unique<MaxPool2D>("pool", 2, 2); },
                {2, 2, 6, 5},
                -1.f,
                1.f,
                true});
  cs.push_back({"maxpool3_s2",
                [] { return std::make_unique<MaxPool2D>("pool", 3, 2); },
                {1, 2, 7, 7},
                -1.f,
                1.f,
                true});
  cs.push_back({"avgpool", [] { return std::make_unique<GlobalAvgPool>("pool"); }, {3, 4, 3, 5}});
  cs.push_back({"batchnorm", [] { return std::make_unique<BatchNorm2D>("bn", 3); }, {4, 3, 3, 3}});
  cs.push_back({"gelu", [] { return std::make_unique<GELU>("gelu"); }, {4, 20}, -4.f, 4.f});
  cs.push_back({"dropout", [] { return std::make_unique<Dropout>("drop", 0.3f); }, {4, 25}});
  cs.push_back({"flatten", [] { return std::make_unique<Flatten>("flat"); }, {2, 3, 2, 2}});
  return cs;
}

class LayerCase : public ::testing::TestWithParam<Case> {
 protected:
  std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(1);
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

// ---- finite differences in fp32 ---------------------------------------------------------

TEST_P(LayerCase, BackwardMatchesFiniteDifferences) {
  const Case& c = GetParam();
  OneLayer one(c.make(), DType::f32, 3, *backend);
  Context ctx{*backend, DType::f32, true, 1234};
  auto xv = make_input(c, 5);
  Tensor x(xv.data(), c.x, DType::f32);
  const Tensor& y0 = one.layer().forward(ctx, x);
  const auto r = uniform_floats(size_t(y0.numel()), -1.f, 1.f, 6);
  std::vector<float> rv = r;
  const Tensor& dx_t = one.layer().backward(ctx, Tensor(rv.data(), y0.shape, DType::f32));
  ASSERT_EQ(dx_t.shape, c.x);
  const auto dx = copy_of(dx_t);
  const auto grads = copy_of(one.model->grad());
  auto loss = [&] { return dot(one.layer().forward(ctx, x), r); };
  const float eps = c.distinct ? 1e-2f : 1e-2f;
  check_fd("d input", xv.data(), dx, loss, eps);
  if (one.model->num_params() > 0) {
    // Parameters are perturbed in the fp32 masters, which fp32 layers use directly.
    check_fd("d params", one.model->master().as<float>(), grads, loss, eps);
  }
}

// ---- fp16 / bf16 against fp32 ------------------------------------------------------------

// Tolerances relative to each tensor's largest magnitude: an fp16 value carries 11
// significant bits (unit roundoff 4.9e-4), bf16 8 (3.9e-3); a layer rounds its input, its
// weights and its output, and sums of up to ~100 terms in fp32 add little. So 4 and 8 unit
// roundoffs, with room for the input rounding being amplified by BatchNorm's 1/std.
double tolerance(DType t) { return t == DType::f16 ? 4e-3 : 3e-2; }

class LayerLowPrecision : public ::testing::TestWithParam<std::tuple<Case, DType>> {
 protected:
  std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(1);
};

TEST_P(LayerLowPrecision, ForwardAndBackwardCloseToFp32) {
  const auto& [c, dt] = GetParam();
  OneLayer ref(c.make(), DType::f32, 3, *backend), low(c.make(), dt, 3, *backend);
  Context cref{*backend, DType::f32, true, 99}, clow{*backend, dt, true, 99};
  const auto xv = make_input(c, 5);
  // The fp32 reference sees the same (rounded) input as the low-precision layer.
  std::vector<uint16_t> x16(xv.size());
  std::vector<float> xr(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    x16[i] = dt == DType::f16 ? float_to_half(xv[i]) : float_to_bf16(xv[i]);
    xr[i] = dt == DType::f16 ? half_to_float(x16[i]) : bf16_to_float(x16[i]);
  }
  const auto yr = copy_of(ref.layer().forward(cref, Tensor(xr.data(), c.x, DType::f32)));
  const Tensor& yl_t = low.layer().forward(clow, Tensor(x16.data(), c.x, dt));
  EXPECT_EQ(yl_t.dtype, dt);
  const auto yl = copy_of(yl_t);
  EXPECT_LE(rel_err(yl, yr), tolerance(dt)) << "forward";

  auto r = uniform_floats(yr.size(), -1.f, 1.f, 6);
  std::vector<uint16_t> r16(r.size());
  for (size_t i = 0; i < r.size(); ++i) {
    r16[i] = dt == DType::f16 ? float_to_half(r[i]) : float_to_bf16(r[i]);
    r[i] = dt == DType::f16 ? half_to_float(r16[i]) : bf16_to_float(r16[i]);
  }
  const Shape ys = yl_t.shape;
  const auto dxr = copy_of(ref.layer().backward(cref, Tensor(r.data(), ys, DType::f32)));
  const auto dxl = copy_of(low.layer().backward(clow, Tensor(r16.data(), ys, dt)));
  EXPECT_LE(rel_err(dxl, dxr), tolerance(dt)) << "input gradient";
  for (size_t p = 0; p < ref.model->params().size(); ++p) {
    const auto gr = copy_of(ref.model->params()[p].grad);
    const auto gl = copy_of(low.model->params()[p].grad);
    EXPECT_LE(rel_err(gl, gr), tolerance(dt)) << ref.model->params()[p].name << " gradient";
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, LayerCase, ::testing::ValuesIn(cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Layers, LayerLowPrecision,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values(DType::f16, DType::bf16)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

// ---- the two CPU convolutions agree --------------------------------------------------------

// im2col + OpenBLAS and oneDNN (RINGTRAIN_CONV) on the same inputs: forward with fused bias +
// ReLU, backward data, backward weights and bias. Both sum in fp32 in different orders.
TEST(ConvImplementations, Im2colAndOneDnnAgree) {
  const std::vector<kernels::ConvShape> shapes = {{3, 5, 9, 8, 7, 3, 3, 1, 1},
                                                  {2, 4, 11, 10, 6, 3, 3, 2, 0},
                                                  {2, 6, 7, 7, 5, 1, 1, 2, 0},
                                                  {2, 32, 12, 12, 16, 3, 3, 1, 0},
                                                  {1, 3, 8, 8, 4, 5, 5, 1, 2}};
  struct Out {
    std::vector<float> y, dx, dw, db;
  };
  auto run = [](const char* impl, const kernels::ConvShape& cs) {
    setenv("RINGTRAIN_CONV", impl, 1);  // read at a backend's first convolution
    auto be = kernels::make_cpu_backend(1);
    auto x = uniform_floats(size_t(cs.n * cs.c * cs.h * cs.w), -1.f, 1.f, 1);
    auto w = uniform_floats(size_t(cs.k * cs.c * cs.r * cs.s), -1.f, 1.f, 2);
    auto b = uniform_floats(size_t(cs.k), -1.f, 1.f, 3);
    const Shape ys{cs.n, cs.k, cs.p(), cs.q()};
    auto dy = uniform_floats(size_t(shape_numel(ys)), -1.f, 1.f, 4);
    Out o;
    o.y.resize(dy.size());
    o.dx.resize(x.size());
    o.dw.resize(w.size());
    o.db.resize(b.size());
    const Tensor tx(x.data(), {cs.n, cs.c, cs.h, cs.w}, DType::f32),
        tw(w.data(), {cs.k, cs.c, cs.r, cs.s}, DType::f32), tb(b.data(), {cs.k}, DType::f32),
        tdy(dy.data(), ys, DType::f32), tdb(o.db.data(), {cs.k}, DType::f32);
    be->conv2d_forward(cs, tx, tw, &tb, Activation::relu, Tensor(o.y.data(), ys, DType::f32));
    be->conv2d_backward_data(cs, tdy, tw, Tensor(o.dx.data(), tx.shape, DType::f32));
    be->conv2d_backward_filter(cs, tx, tdy, Tensor(o.dw.data(), tw.shape, DType::f32), &tdb);
    return o;
  };
  for (const auto& cs : shapes) {
    SCOPED_TRACE(testing::Message() << "C " << cs.c << " K " << cs.k << " " << cs.r << "x" << cs.s
                                    << " stride " << cs.stride << " pad " << cs.pad);
    const Out a = run("im2col", cs), b = run("onednn", cs);
    EXPECT_LE(rel_err(a.y, b.y), 1e-5) << "forward";
    EXPECT_LE(rel_err(a.dx, b.dx), 1e-5) << "backward data";
    EXPECT_LE(rel_err(a.dw, b.dw), 1e-5) << "backward weights";
    EXPECT_LE(rel_err(a.db, b.db), 1e-5) << "backward bias";
  }
  unsetenv("RINGTRAIN_CONV");
}

// ---- fused activation, dropout, overrides, models ---------------------------------------

// Conv2D with the fused ReLU equals Conv2D followed by a ReLU layer, forward and backward.
TEST(FusedActivation, ConvReluEqualsSeparateLayers) {
  auto be = kernels::make_cpu_backend(1);
  Context ctx{*be, DType::f32, true, 0};
  OneLayer fused(conv(3, 4, 3, 1, 1, true, Activation::relu), DType::f32, 3, *be);
  OneLayer plain(conv(3, 4, 3, 1, 1, true), DType::f32, 3, *be);
  ReLU relu("relu");
  auto xv = uniform_floats(2 * 3 * 5 * 5, -1.f, 1.f, 8);
  Tensor x(xv.data(), {2, 3, 5, 5}, DType::f32);
  const auto yf = copy_of(fused.layer().forward(ctx, x));
  const auto yp = copy_of(relu.forward(ctx, plain.layer().forward(ctx, x)));
  ASSERT_EQ(yf, yp);
  auto r = uniform_floats(yf.size(), -1.f, 1.f, 9);
  Tensor dy(r.data(), {2, 4, 5, 5}, DType::f32);
  const auto dxf = copy_of(fused.layer().backward(ctx, dy));
  const auto dxp = copy_of(plain.layer().backward(ctx, relu.backward(ctx, dy)));
  EXPECT_EQ(dxf, dxp);
  EXPECT_EQ(copy_of(fused.model->grad()), copy_of(plain.model->grad()));
}

// Backward of the fused and the separate-layer model from the same dy: the first layer's
// input gradient (n values) and the parameter gradients are bitwise equal.
void expect_same_backward(Context& ctx, Model& fused, Model& plain, const Tensor& dy, size_t n) {
  std::vector<float> dxf, dxp;
  LayerHooks fused_hooks, plain_hooks;
  fused_hooks.after_backward = [&](size_t l, const Tensor& g) {
    if (l == 0) dxf = copy_of(g);
  };
  plain_hooks.after_backward = [&](size_t l, const Tensor& g) {
    if (l == 0) dxp = copy_of(g);
  };
  fused.backward(ctx, dy, fused_hooks);
  plain.backward(ctx, dy, plain_hooks);
  ASSERT_EQ(dxf.size(), n);
  EXPECT_EQ(dxf, dxp);
  EXPECT_EQ(copy_of(fused.grad()), copy_of(plain.grad()));
}

// conv + fused ReLU read by a second convolution, which applies the ReLU's gradient to its dx
// in place (as the cnn builds it), equals conv, ReLU and conv as three layers, forward and
// backward, with the first layer's input gradient (the mask reaches it) and the weights'.
TEST(FusedActivation, ReluGradientInNextConvEqualsSeparateLayers) {
  auto be = kernels::make_cpu_backend(1);
  Context ctx{*be, DType::f32, true, 0};
  auto build = [&](bool fused) {
    std::vector<std::unique_ptr<Layer>> layers;
    layers.push_back(std::make_unique<Conv2D>(
        "conv1",
        Conv2D::Options{2, 16, 3, 1, 1, true, fused ? Activation::relu : Activation::none}));
    if (!fused) layers.push_back(std::make_unique<ReLU>("relu"));
    layers.push_back(std::make_unique<Conv2D>("conv2", Conv2D::Options{16, 4, 3, 1, 0, true}));
    auto m = std::make_unique<Model>(std::move(layers), DType::f32);
    m->layers()[0]->set_needs_input_grad(true);
    m->init_parameters(5, *be);
    return m;
  };
  auto fused = build(true), plain = build(false);
  auto xv = uniform_floats(2 * 2 * 7 * 7, -1.f, 1.f, 14);
  Tensor x(xv.data(), {2, 2, 7, 7}, DType::f32);
  const auto yf = copy_of(fused->forward(ctx, x)), yp = copy_of(plain->forward(ctx, x));
  ASSERT_EQ(yf, yp);
  auto r = uniform_floats(yf.size(), -1.f, 1.f, 15);
  expect_same_backward(ctx, *fused, *plain, Tensor(r.data(), {2, 4, 5, 5}, DType::f32), xv.size());
}

// conv + fused ReLU + max pooling with the ReLU's gradient applied by the pooling (as the
// cnn builds it) equals conv, ReLU and pooling as three layers, forward and backward.
TEST(FusedActivation, ReluGradientInPoolingEqualsSeparateLayers) {
  auto be = kernels::make_cpu_backend(1);
  Context ctx{*be, DType::f32, true, 0};
  auto build = [&](bool fused) {
    std::vector<std::unique_ptr<Layer>> layers;
    auto c = std::make_unique<Conv2D>(
        "conv", Conv2D::Options{2, 3, 3, 1, 1, true, fused ? Activation::relu : Activation::none});
    auto pool = std::make_unique<MaxPool2D>("pool", 2, 2);
    if (fused) {
      c->set_relu_grad_done_by_next(true);
      pool->set_relu_input(true);
    }
    layers.push_back(std::move(c));
    if (!fused) layers.push_back(std::make_unique<ReLU>("relu"));
    layers.push_back(std::move(pool));
    auto m = std::make_unique<Model>(std::move(layers), DType::f32);
    m->layers()[0]->set_needs_input_grad(true);
    m->init_parameters(4, *be);
    return m;
  };
  auto fused = build(true), plain = build(false);
  // Inputs that make many windows all-negative after the convolution.
  auto xv = uniform_floats(2 * 2 * 6 * 6, -1.f, 0.5f, 12);
  Tensor x(xv.data(), {2, 2, 6, 6}, DType::f32);
  const auto yf = copy_of(fused->forward(ctx, x)), yp = copy_of(plain->forward(ctx, x));
  ASSERT_EQ(yf, yp);
  int zero_windows = 0;
  for (float v : yf) zero_windows += v == 0.f;
  EXPECT_GT(zero_windows, 0) << "the test needs windows whose maximum is 0";
  auto r = uniform_floats(yf.size(), -1.f, 1.f, 13);
  expect_same_backward(ctx, *fused, *plain, Tensor(r.data(), {2, 3, 3, 3}, DType::f32), xv.size());
}

TEST(DropoutMask, RateDeterminismAndStreams) {
  auto be = kernels::make_cpu_backend(1);
  constexpr int64_t n = 200000;
  constexpr float p = 0.25f;
  std::vector<float> x(n, 1.f), y(n);
  std::vector<uint8_t> m1(n), m2(n), m3(n);
  Tensor xt(x.data(), {n}, DType::f32), yt(y.data(), {n}, DType::f32);
  be->dropout_forward(xt, p, 77, yt, Tensor(m1.data(), {n}, DType::u8));
  const double kept = std::accumulate(m1.begin(), m1.end(), 0.0) / n;
  // Binomial: the kept share within 5 standard deviations of 1 - p.
  EXPECT_NEAR(kept, 1.0 - p, 5 * std::sqrt(p * (1 - p) / n));
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(y[size_t(i)], m1[size_t(i)] ? 1.f / (1.f - p) : 0.f) << "at " << i;
  be->dropout_forward(xt, p, 77, yt, Tensor(m2.data(), {n}, DType::u8));
  EXPECT_EQ(m1, m2) << "the same seed must give the same mask";
  be->dropout_forward(xt, p, 78, yt, Tensor(m3.data(), {n}, DType::u8));
  const double same = double(std::inner_product(m1.begin(), m1.end(), m3.begin(), int64_t(0),
                                                std::plus<>(), std::equal_to<>())) /
                      n;
  // Independent masks agree with probability p^2 + (1-p)^2 = 0.625.
  EXPECT_NEAR(same, p * p + (1 - p) * (1 - p), 0.01) << "another seed must give another mask";
  // Evaluation is the identity.
  Dropout d("drop", p);
  Context eval{*be, DType::f32, false, 77};
  EXPECT_EQ(d.forward(eval, xt).data, xt.data);
}

TEST(LayerPrecision, OverrideKeepsALayerInFp32) {
  auto be = kernels::make_cpu_backend(1);
  auto model = build_model("cnn", {1, 12, 12}, 10, {}, DType::bf16, "conv2=fp32");
  model->init_parameters(1, *be);
  Context ctx{*be, DType::bf16, true, 5};
  auto xv = uniform_floats(2 * 144, -1.f, 1.f, 3);
  std::vector<uint16_t> x16;
  for (float v : xv) x16.push_back(float_to_bf16(v));
  std::vector<DType> out;
  LayerHooks hooks;
  hooks.after_forward = [&](size_t, const Tensor& y) { out.push_back(y.dtype); };
  model->forward(ctx, Tensor(x16.data(), {2, 1, 12, 12}, DType::bf16), hooks);
  ASSERT_EQ(out.size(), model->layers().size());
  EXPECT_EQ(out[0], DType::bf16);  // conv1
  EXPECT_EQ(out[1], DType::f32);   // conv2, kept in fp32
  EXPECT_EQ(out[2], DType::bf16);  // the next layer computes in bf16 again
  EXPECT_EQ(out.back(), DType::f32);
  std::vector<float> dl(20, 0.01f);
  model->backward(ctx, Tensor(dl.data(), {2, 10}, DType::f32));  // runs through the casts
  EXPECT_TRUE(test::throws_kind(
      [&] {
        build_model("cnn", {1, 12, 12}, 10, {}, DType::bf16, "conv9=fp32");
      },
      ErrorKind::input));
  EXPECT_TRUE(test::throws_kind(
      [&] {
        build_model("cnn", {1, 12, 12}, 10, {}, DType::bf16, "conv1=fp8");
      },
      ErrorKind::input));
}

TEST(Models, CnnAndResnetShapesAndNames) {
  auto be = kernels::make_cpu_backend(1);
  auto m = build_model("cnn", {1, 28, 28}, 10, {}, DType::f32);
  EXPECT_EQ(m->num_params(), 32 * 9 + 32 + 64 * 32 * 9 + 64 + 9216 * 128 + 128 + 1280 + 10);
  EXPECT_EQ(m->params()[0].name, "conv1.weight");
  EXPECT_EQ(m->params()[0].shape, (Shape{32, 1, 3, 3}));

  auto r = build_model("resnet", {3, 32, 32}, 10, {{"depth", "2"}, {"width", "8"}}, DType::f32);
  r->init_parameters(1, *be);
  // 6 depth + 2 = 14 weighted layers; BatchNorm running averages as buffers.
  int convs = 0, bns = 0;
  for (const Param& p : r->params()) {
    convs += p.shape.size() == 4 && p.shape[2] == 3;
    bns += p.name.find("bn.weight") != std::string::npos ||
           p.name.find("bn1.weight") != std::string::npos ||
           p.name.find("bn2.weight") != std::string::npos;
  }
  EXPECT_EQ(convs, 1 + 3 * 2 * 2);
  EXPECT_EQ(r->buffers().size(), size_t(2 * (bns)));
  EXPECT_NE(r->find_layer("stage2.block1.down.conv"), nullptr);
  EXPECT_EQ(r->buffers()[1].name, "stem.bn.running_var");
  EXPECT_EQ(r->buffers()[1].value.as<float>()[0], 1.f);
  auto xv = uniform_floats(2 * 3 * 32 * 32, -1.f, 1.f, 4);
  Context ctx{*be, DType::f32, true, 0};
  const Tensor& logits = r->forward(ctx, Tensor(xv.data(), {2, 3, 32, 32}, DType::f32));
  EXPECT_EQ(logits.shape, (Shape{2, 10}));
  // Bad options are input errors, not crashes.
  EXPECT_TRUE(test::throws_kind(
      [&] {
        build_model("resnet", {3, 32, 32}, 10, {{"depth", "0"}}, DType::f32);
      },
      ErrorKind::input));
  EXPECT_TRUE(
      test::throws_kind([&] { build_model("cnn", {784}, 10, {}, DType::f32); }, ErrorKind::input));
}

}  // namespace
}  // namespace ringtrain
