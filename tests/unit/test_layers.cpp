// Unit tests of the layers (nn/layers.hpp), the MLP model (nn/model.hpp) and the
// softmax cross-entropy kernel: every backward pass against central finite differences
// in fp32 on the CPU backend, and the 16-bit GEMM of the CPU backend against the fp32
// GEMM of its widened inputs, rounded once.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/kernels.hpp"
#include "nn/graph_builder.hpp"
#include "nn/layers.hpp"
#include "nn/model.hpp"
#include "test_util.hpp"

namespace ringtrain {
namespace {

using test::close;
using test::uniform_floats;

// fp32 gradient-check tolerances: the objective is summed in double, so the error of a
// central difference is the fp32 rounding of the forward pass divided by 2*eps.
constexpr double kRtol = 2e-2, kAtol = 1e-3;

// Checks grad[i] against the central difference of `loss` in v[i], for every i.
// The step is the one actually taken in fp32, (v+eps) - (v-eps), not 2*eps.
void check_gradient(const std::string& what, float* v, const std::vector<float>& grad,
                    const std::function<double()>& loss, float eps, double atol = kAtol,
                    const std::function<bool()>& skip = nullptr) {
  int failures = 0;
  for (size_t i = 0; i < grad.size() && failures < 10; ++i) {
    const float keep = v[i];
    v[i] = keep + eps;
    const double lp = loss();
    const bool skip_p = skip && skip();
    v[i] = keep - eps;
    const double lm = loss();
    const bool skip_m = skip && skip();
    v[i] = keep;
    if (skip_p || skip_m) continue;
    const double fd = (lp - lm) / (double(keep + eps) - double(keep - eps));
    if (!close(grad[i], fd, kRtol, atol)) {
      ADD_FAILURE() << what << " at index " << i << ": backward gives " << grad[i]
                    << ", finite difference " << fd;
      ++failures;
    }
  }
}

std::vector<float> copy_of(const Tensor& t) {
  const float* p = t.as<float>();
  return std::vector<float>(p, p + t.numel());
}

// sum(y * r) in double: a scalar objective whose gradient in y is r.
double dot(const Tensor& y, const std::vector<float>& r) {
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += double(y.as<float>()[i]) * r[size_t(i)];
  return s;
}

// An fp32 Linear layer bound to parameters of its own (the Model is not needed for it).
struct BoundLinear {
  BoundLinear(int64_t in, int64_t out, uint32_t seed)
      : layer("fc", in, out),
        w_buf(size_t(in * out) * 4),
        w_grad(size_t(in * out) * 4),
        b_buf(size_t(out) * 4),
        b_grad(size_t(out) * 4) {
    w.name = "fc.weight";
    w.shape = {out, in};
    w.master = w.work = Tensor(w_buf.data(), w.shape, DType::f32);
    w.grad = Tensor(w_grad.data(), w.shape, DType::f32);
    b.name = "fc.bias";
    b.shape = {out};
    b.master = b.work = Tensor(b_buf.data(), b.shape, DType::f32);
    b.grad = Tensor(b_grad.data(), b.shape, DType::f32);
    const auto wv = uniform_floats(size_t(in * out), -1.f, 1.f, seed);
    const auto bv = uniform_floats(size_t(out), -1.f, 1.f, seed + 1);
    std::copy(wv.begin(), wv.end(), w.master.as<float>());
    std::copy(bv.begin(), bv.end(), b.master.as<float>());
    layer.bind({&w, &b});
  }
  BoundLinear(const BoundLinear&) = delete;  // the layer holds pointers to w and b

  Linear layer;
  Buffer w_buf, w_grad, b_buf, b_grad;
  Param w, b;
};

class LayerGrad : public ::testing::Test {
 protected:
  std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(1);
  Context ctx{*backend, DType::f32, true};
};

TEST_F(LayerGrad, Linear) {
  constexpr int64_t n = 5, in = 7, out = 4;
  BoundLinear fc(in, out, 11);
  auto xv = uniform_floats(size_t(n * in), -1.f, 1.f, 12);
  const auto r = uniform_floats(size_t(n * out), -1.f, 1.f, 13);
  Tensor x(xv.data(), {n, in}, DType::f32);
  auto loss = [&] { return dot(fc.layer.forward(ctx, x), r); };

  const Tensor& y = fc.layer.forward(ctx, x);
  ASSERT_EQ(y.shape, (Shape{n, out}));
  ASSERT_EQ(y.dtype, DType::f32);
  // The forward pass itself against y = x W^T + b in double.
  for (int64_t s = 0; s < n; ++s)
    for (int64_t o = 0; o < out; ++o) {
      double want = fc.b.master.as<float>()[o];
      for (int64_t k = 0; k < in; ++k)
        want += double(xv[size_t(s * in + k)]) * fc.w.master.as<float>()[o * in + k];
      EXPECT_NEAR(y.as<float>()[s * out + o], want, 1e-5) << "at index " << s * out + o;
    }
  std::vector<float> rv = r;
  Tensor dy(rv.data(), {n, out}, DType::f32);
  const Tensor& dx_t = fc.layer.backward(ctx, dy);
  ASSERT_EQ(dx_t.shape, (Shape{n, in}));
  const auto dw = copy_of(fc.w.grad), db = copy_of(fc.b.grad), dx = copy_of(dx_t);

  check_gradient("dW", fc.w.master.as<float>(), dw, loss, 1e-2f);
  check_gradient("db", fc.b.master.as<float>(), db, loss, 1e-2f);
  check_gradient("dx", xv.data(), dx, loss, 1e-2f);
}

TEST_F(LayerGrad, ReLU) {
  constexpr int64_t n = 6, f = 9;
  // Inputs at least 0.1 away from the kink, so x +- eps stays on the same side.
  std::mt19937 gen(21);
  std::uniform_real_distribution<float> mag(0.1f, 1.f);
  std::vector<float> xv(static_cast<size_t>(n * f));
  for (auto& v : xv) v = gen() & 1 ? mag(gen) : -mag(gen);
  const auto r = uniform_floats(size_t(n * f), -1.f, 1.f, 22);
  Tensor x(xv.data(), {n, f}, DType::f32);
  ReLU relu("relu");
  auto loss = [&] { return dot(relu.forward(ctx, x), r); };

  const Tensor& y = relu.forward(ctx, x);
  for (int64_t i = 0; i < n * f; ++i)
    ASSERT_EQ(y.as<float>()[i], std::max(xv[size_t(i)], 0.f)) << "at index " << i;
  std::vector<float> rv = r;
  const auto dx = copy_of(relu.backward(ctx, Tensor(rv.data(), {n, f}, DType::f32)));
  check_gradient("dx", xv.data(), dx, loss, 1e-2f);
}

class XentGrad : public LayerGrad, public ::testing::WithParamInterface<float> {};

TEST_P(XentGrad, Dlogits) {
  const float grad_scale = GetParam();
  constexpr int64_t n = 5, c = 4;
  auto lv = uniform_floats(size_t(n * c), -3.f, 3.f, 31);
  std::vector<int32_t> yv = {0, 3, 1, 3, 2};
  Tensor logits(lv.data(), {n, c}, DType::f32), labels(yv.data(), {n}, DType::i32);

  // The loss and the accuracy against a double reference.
  double want_loss = 0;
  int64_t want_correct = 0;
  for (int64_t s = 0; s < n; ++s) {
    const float* row = lv.data() + s * c;
    double z = 0;
    for (int64_t j = 0; j < c; ++j) z += std::exp(double(row[j]));
    want_loss += std::log(z) - row[yv[size_t(s)]];
    want_correct += std::max_element(row, row + c) - row == yv[size_t(s)];
  }
  std::vector<float> dl(static_cast<size_t>(n * c));
  Tensor dlogits(dl.data(), {n, c}, DType::f32);
  const kernels::XentResult res = backend->softmax_xent(logits, labels, grad_scale, &dlogits);
  EXPECT_NEAR(res.loss_sum, want_loss, 1e-9 * n);
  EXPECT_EQ(res.correct, want_correct);

  // dlogits is the gradient of grad_scale * (mean loss): the 1/N and the scale included.
  auto loss = [&] {
    return double(grad_scale) * backend->softmax_xent(logits, labels, 1.f, nullptr).loss_sum / n;
  };
  check_gradient("dlogits", lv.data(), dl, loss, 1e-2f, kAtol * grad_scale);
}

INSTANTIATE_TEST_SUITE_P(GradScale, XentGrad, ::testing::Values(1.f, 8.f, 1024.f),
                         [](const auto& info) { return "x" + std::to_string(int(info.param)); });

// The whole MLP: Model::backward against finite differences of the mean loss in every
// parameter. A perturbation that moves a hidden pre-activation across zero makes the
// difference meaningless, so those indices are skipped (few: eps is small).
TEST_F(LayerGrad, MlpModelBackward) {
  constexpr int64_t n = 4, in = 6, classes = 3;
  auto model = build_model("mlp", {in}, classes, {{"hidden", "5,4"}}, DType::f32);
  model->init_parameters(7, *backend);
  ASSERT_EQ(model->num_params(), 6 * 5 + 5 + 5 * 4 + 4 + 4 * 3 + 3);
  auto xv = uniform_floats(size_t(n * in), -2.f, 2.f, 41);
  std::vector<int32_t> yv = {2, 0, 1, 2};
  Tensor x(xv.data(), {n, in}, DType::f32), labels(yv.data(), {n}, DType::i32);

  // Which hidden units are active: the layer outputs of a forward pass, layer by layer.
  auto active = [&] {
    std::vector<bool> mask;
    const Tensor* cur = &x;
    for (const auto& layer : model->layers()) {
      cur = &layer->forward(ctx, *cur);
      if (layer != model->layers().back())  // hidden layers, ReLU fused
        for (int64_t i = 0; i < cur->numel(); ++i) mask.push_back(cur->as<float>()[i] > 0.f);
    }
    return mask;
  };
  const std::vector<bool> base_mask = active();
  auto loss = [&] {
    return backend->softmax_xent(model->forward(ctx, x), labels, 1.f, nullptr).loss_sum / n;
  };
  int skipped = 0;
  auto crossed = [&] {
    const bool c = active() != base_mask;
    skipped += c;
    return c;
  };

  const Tensor& logits = model->forward(ctx, x);
  ASSERT_EQ(logits.shape, (Shape{n, classes}));
  ASSERT_EQ(logits.dtype, DType::f32);
  std::vector<float> dl(static_cast<size_t>(n * classes));
  Tensor dlogits(dl.data(), {n, classes}, DType::f32);
  backend->softmax_xent(logits, labels, 1.f, &dlogits);
  model->backward(ctx, dlogits);
  const auto grad = copy_of(model->grad());

  check_gradient("model gradient", model->master().as<float>(), grad, loss, 2e-3f, kAtol, crossed);
  EXPECT_LE(skipped, 6) << "too many perturbations crossed a ReLU kink to be a useful check";
  // Every parameter has a non-zero gradient somewhere in each layer (nothing left unwritten).
  for (const Param& p : model->params()) {
    double s = 0;
    for (int64_t i = 0; i < p.grad.numel(); ++i) s += std::fabs(p.grad.as<float>()[i]);
    EXPECT_GT(s, 0.0) << p.name << " has an all-zero gradient";
  }
}

// ---- 16-bit GEMM: fp32 products and sums, one rounding ---------------------------------

float widen(uint16_t v, DType t) { return t == DType::f16 ? half_to_float(v) : bf16_to_float(v); }
uint16_t narrow(float v, DType t) { return t == DType::f16 ? float_to_half(v) : float_to_bf16(v); }

// Random values of dtype t, as 16-bit patterns.
std::vector<uint16_t> random16(size_t n, DType t, uint32_t seed) {
  std::vector<uint16_t> v;
  for (float f : uniform_floats(n, -2.f, 2.f, seed)) v.push_back(narrow(f, t));
  return v;
}

std::vector<float> widened(const std::vector<uint16_t>& v, DType t) {
  std::vector<float> out;
  for (uint16_t x : v) out.push_back(widen(x, t));
  return out;
}

class Gemm16 : public ::testing::TestWithParam<std::tuple<DType, bool, bool>> {};

// The widening path (the reference for the native 16-bit GEMMs, tests/unit/test_cpu_gemm.cpp),
// with each GEMM provider.
TEST_P(Gemm16, EqualsFp32GemmRoundedOnce) {
  const auto [dt, ta, tb] = GetParam();
  for (auto provider : {kernels::cpu::GemmProvider::onednn, kernels::cpu::GemmProvider::openblas}) {
    SCOPED_TRACE(kernels::cpu::provider_name(provider));
    kernels::cpu::CpuOptions opts;
    opts.gemm = provider;
    opts.native16 = false;
    auto be = std::make_unique<kernels::cpu::CpuBackend>(1, opts);
    const std::vector<std::tuple<int64_t, int64_t, int64_t>> sizes = {{7, 5, 13}, {33, 17, 65}};
    for (const auto& [m, n, k] : sizes) {
      SCOPED_TRACE(testing::Message() << "m " << m << " n " << n << " k " << k);
      const Shape sa = ta ? Shape{k, m} : Shape{m, k}, sb = tb ? Shape{n, k} : Shape{k, n};
      auto a16 = random16(size_t(m * k), dt, 51), b16 = random16(size_t(k * n), dt, 52);
      auto c16 = random16(size_t(m * n), dt, 53);
      auto a32 = widened(a16, dt), b32 = widened(b16, dt), c32 = widened(c16, dt);
      const Tensor a16t(a16.data(), sa, dt), b16t(b16.data(), sb, dt);
      const Tensor a32t(a32.data(), sa, DType::f32), b32t(b32.data(), sb, DType::f32);

      for (auto [alpha, beta] : {std::pair{1.f, 0.f}, std::pair{0.5f, 0.25f}}) {
        SCOPED_TRACE(testing::Message() << "alpha " << alpha << " beta " << beta);
        // Reference: the fp32 GEMM of the widened inputs (c included, for beta).
        std::vector<float> ref = c32;
        be->gemm(ta, tb, alpha, a32t, b32t, beta, Tensor(ref.data(), {m, n}, DType::f32));
        // ... which itself is right to fp32 accuracy, against a double loop.
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t l = 0; l < k; ++l)
              s += double(a32[size_t(ta ? l * m + i : i * k + l)]) *
                   b32[size_t(tb ? j * k + l : l * n + j)];
            const double want = alpha * s + beta * double(c32[size_t(i * n + j)]);
            ASSERT_NEAR(ref[size_t(i * n + j)], want, 1e-5 * k) << "at index " << i * n + j;
          }

        // 16-bit output: exactly the reference rounded once.
        std::vector<uint16_t> out16 = c16;
        be->gemm(ta, tb, alpha, a16t, b16t, beta, Tensor(out16.data(), {m, n}, dt));
        for (size_t i = 0; i < out16.size(); ++i)
          ASSERT_EQ(narrow(ref[i], dt), out16[i]) << "at index " << i << " (fp32 " << ref[i] << ")";

        // fp32 output from 16-bit inputs: exactly the reference.
        std::vector<float> out32 = c32;
        be->gemm(ta, tb, alpha, a16t, b16t, beta, Tensor(out32.data(), {m, n}, DType::f32));
        for (size_t i = 0; i < out32.size(); ++i) ASSERT_EQ(ref[i], out32[i]) << "at index " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DtypeTrans, Gemm16,
                         ::testing::Combine(::testing::Values(DType::f16, DType::bf16),
                                            ::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_At" : "_A") +
                                  (std::get<2>(info.param) ? "Bt" : "B");
                         });

}  // namespace
}  // namespace ringtrain
