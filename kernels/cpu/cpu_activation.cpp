// The CPU activation family: the pointwise kernels y = f(x), dx = dy * f'(x) that the kernel
// table holds (kernel_table.hpp) — GELU exact (erf), GELU in GPT-2's tanh form and SiLU
// (x sigmoid(x)) — and their registration. An activation added here (and in
// kernels/cuda/activation.cu) needs no other kernels file: docs/architecture.md, "Adding an op".
//
// The tanh GELU is x * sigmoid(2u) (u the tanh's argument). With
// AVX-512: one pass of intrinsics, 16-bit tensors widened and rounded in registers, the
// sigmoid's division done by VRCP14PS and a Newton step (vec512.hpp). Elsewhere: 16-bit
// tensors widened to fp32 in blocks on the stack, so the arithmetic loop is always fp32 and
// vectorises (exp_fast, as a sigmoid). The exact GELU is a plain OpenMP loop over std::erf; SiLU
// the widened fp32 loop over exp_fast.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/elem.hpp"
#include "kernels/cpu/vec512.hpp"
#include "kernels/cpu/vec_math.hpp"
#include "kernels/kernel_table.hpp"

namespace ringtrain::kernels::cpu {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
constexpr int64_t kBlock = 1024;  // elements widened at a time

RT_INLINE void gelu_tanh_body(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    // 0.5 (1 + tanh(u)) = sigmoid(2u): no cancellation where tanh(u) is near -1.
    y[i] = v / (1.f + exp_fast(-2.f * kSqrt2OverPi * (v + kCubic * v * v * v)));
  }
}

// dx = dy * d/dx gelu(x); dx may alias dy.
RT_INLINE void gelu_tanh_grad_body(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    // With s = sigmoid(2u): 0.5 (1 + tanh u) = s and 0.5 sech^2 u = 2 s (1 - s).
    const float sg = 1.f / (1.f + exp_fast(-2.f * kSqrt2OverPi * (v + kCubic * v * v * v)));
    const float grad = sg + v * 2.f * sg * (1.f - sg) * kSqrt2OverPi * (1.f + 3.f * kCubic * v * v);
    dx[i] = dy[i] * grad;
  }
}

void gelu_tanh_base(const float* x, float* y, int64_t n) { gelu_tanh_body(x, y, n); }
void gelu_tanh_grad_base(const float* x, const float* dy, float* dx, int64_t n) {
  gelu_tanh_grad_body(x, dy, dx, n);
}

// Elements [lo, hi) of y = gelu(x), 16 lanes at a time. All tensors of dtype T, or of any
// float dtypes when T is not a float dtype (the dtype tests then stay inside the loop).
template <DType T, bool kNative>
RT_AVX512_TARGET void gelu_tanh_avx512(const Tensor& x, const Tensor& y, int64_t lo, int64_t hi) {
  const DType tx = v512::dtype<T>(x), ty = v512::dtype<T>(y);
  const __m512 k1 = _mm512_set1_ps(2.f * kSqrt2OverPi);
  const __m512 k3 = _mm512_set1_ps(2.f * kSqrt2OverPi * kCubic);
  for (int64_t i = lo; i < hi; i += 16) {
    const __mmask16 m = v512::tail_mask(i, hi);
    const __m512 v = v512::load(x.data, tx, i, m);
    const __m512 t = _mm512_mul_ps(v, _mm512_fmadd_ps(_mm512_mul_ps(v, v), k3, k1));  // 2u
    v512::store<kNative>(y.data, ty, i, m, _mm512_mul_ps(v, v512::sigmoid(t)));
  }
}

// Elements [lo, hi) of dx = dy * gelu'(x); dx may alias dy. T as above.
template <DType T, bool kNative>
RT_AVX512_TARGET void gelu_tanh_grad_avx512(const Tensor& x, const Tensor& dy, const Tensor& dx,
                                            int64_t lo, int64_t hi) {
  const DType tx = v512::dtype<T>(x), td = v512::dtype<T>(dy), to = v512::dtype<T>(dx);
  const __m512 k1 = _mm512_set1_ps(2.f * kSqrt2OverPi);
  const __m512 k3 = _mm512_set1_ps(2.f * kSqrt2OverPi * kCubic);
  const __m512 k3d = _mm512_set1_ps(6.f * kSqrt2OverPi * kCubic);  // d(2u)/dv = k1 + k3d v^2
  for (int64_t i = lo; i < hi; i += 16) {
    const __mmask16 m = v512::tail_mask(i, hi);
    const __m512 v = v512::load(x.data, tx, i, m);
    const __m512 v2 = _mm512_mul_ps(v, v);
    const __m512 s = v512::sigmoid(_mm512_mul_ps(v, _mm512_fmadd_ps(v2, k3, k1)));
    // gelu' = s + v s (1 - s) d(2u)/dv
    const __m512 ds = _mm512_fnmadd_ps(s, s, s);
    const __m512 g = _mm512_fmadd_ps(ds, _mm512_mul_ps(v, _mm512_fmadd_ps(v2, k3d, k1)), s);
    const __m512 d = v512::load(dy.data, td, i, m);
    v512::store<kNative>(dx.data, to, i, m, _mm512_mul_ps(d, g));
  }
}

template <DType T, bool kNative>
struct GeluAvx512 {
  void operator()(const Tensor& x, const Tensor& y, int64_t lo, int64_t hi) const {
    gelu_tanh_avx512<T, kNative>(x, y, lo, hi);
  }
};
template <DType T, bool kNative>
struct GeluGradAvx512 {
  void operator()(const Tensor& x, const Tensor& dy, const Tensor& dx, int64_t lo,
                  int64_t hi) const {
    gelu_tanh_grad_avx512<T, kNative>(x, dy, dx, lo, hi);
  }
};

// Elements [lo, hi) of t as fp32: a pointer into t when fp32, else widened into buf.
const float* span_f32(const Tensor& t, int64_t lo, int64_t n, float* buf) {
  if (t.dtype == DType::f32) return t.as<float>() + lo;
  to_f32(static_cast<const char*>(t.data) + lo * int64_t(dtype_size(t.dtype)), t.dtype, buf, n, 1);
  return buf;
}
float* out_span(const Tensor& t, int64_t lo, float* buf) {
  return t.dtype == DType::f32 ? t.as<float>() + lo : buf;
}
void commit_span(const Tensor& t, int64_t lo, int64_t n, const float* buf) {
  if (t.dtype != DType::f32)
    from_f32(buf, static_cast<char*>(t.data) + lo * int64_t(dtype_size(t.dtype)), t.dtype, n, 1);
}

void gelu_tanh(const KernelEnv& env, const Tensor& x, const Tensor& y) {
  const int threads_ = env.threads;
  if (use_avx512()) return v512::run<GeluAvx512>(x.numel(), threads_, x, y);
  parallel_chunks(x.numel(), threads_, [&](int64_t lo, int64_t hi) {
    float xb[kBlock], yb[kBlock];
    for (int64_t b = lo; b < hi; b += kBlock) {
      const int64_t n = std::min(kBlock, hi - b);
      const float* xs = span_f32(x, b, n, xb);
      float* ys = out_span(y, b, yb);
      gelu_tanh_base(xs, ys, n);
      commit_span(y, b, n, ys);
    }
  });
}

void gelu_tanh_backward(const KernelEnv& env, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int threads_ = env.threads;
  if (use_avx512()) return v512::run<GeluGradAvx512>(x.numel(), threads_, x, dy, dx);
  parallel_chunks(x.numel(), threads_, [&](int64_t lo, int64_t hi) {
    float xb[kBlock], db[kBlock], ob[kBlock];
    for (int64_t b = lo; b < hi; b += kBlock) {
      const int64_t n = std::min(kBlock, hi - b);
      const float* xs = span_f32(x, b, n, xb);
      const float* ds = span_f32(dy, b, n, db);
      float* os = out_span(dx, b, ob);
      gelu_tanh_grad_base(xs, ds, os, n);
      commit_span(dx, b, n, os);
    }
  });
}

// ---- SiLU: y = x sigmoid(x), dy/dx = s (1 + x (1 - s)) ----------------------------------

RT_INLINE void silu_body(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.f + exp_fast(-x[i]));
}

RT_INLINE void silu_grad_body(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.f / (1.f + exp_fast(-x[i]));
    dx[i] = dy[i] * (s * (1.f + x[i] * (1.f - s)));
  }
}

void silu(const KernelEnv& env, const Tensor& x, const Tensor& y) {
  parallel_chunks(x.numel(), env.threads, [&](int64_t lo, int64_t hi) {
    float xb[kBlock], yb[kBlock];
    for (int64_t b = lo; b < hi; b += kBlock) {
      const int64_t n = std::min(kBlock, hi - b);
      float* ys = out_span(y, b, yb);
      silu_body(span_f32(x, b, n, xb), ys, n);
      commit_span(y, b, n, ys);
    }
  });
}

void silu_backward(const KernelEnv& env, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  parallel_chunks(x.numel(), env.threads, [&](int64_t lo, int64_t hi) {
    float xb[kBlock], db[kBlock], ob[kBlock];
    for (int64_t b = lo; b < hi; b += kBlock) {
      const int64_t n = std::min(kBlock, hi - b);
      const float* xs = span_f32(x, b, n, xb);
      const float* ds = span_f32(dy, b, n, db);
      float* os = out_span(dx, b, ob);
      silu_grad_body(xs, ds, os, n);
      commit_span(dx, b, n, os);
    }
  });
}

// ---- GELU, exact (erf) --------------------------------------------------------------------

void gelu(const KernelEnv& env, const Tensor& x, const Tensor& y) {
  const int threads_ = env.threads;
  const int64_t n = x.numel();
  dispatch_float(x.dtype, [&](auto X) {
    using EX = decltype(X);
    dispatch_float(y.dtype, [&](auto Y) {
      using EY = decltype(Y);
      const auto* px = x.as<typename EX::storage>();
      auto* py = y.as<typename EY::storage>();
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
      for (int64_t i = 0; i < n; ++i) {
        const float v = EX::load(px[i]);
        py[i] = EY::store(0.5f * v * (1.f + std::erf(v * 0.70710678118654752f)));
      }
    });
  });
}

void gelu_backward(const KernelEnv& env, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int threads_ = env.threads;
  const int64_t n = x.numel();
  dispatch_float(x.dtype, [&](auto X) {
    using EX = decltype(X);
    dispatch_float(dy.dtype, [&](auto D) {
      using ED = decltype(D);
      dispatch_float(dx.dtype, [&](auto O) {
        using EO = decltype(O);
        const auto* px = x.as<typename EX::storage>();
        const auto* pd = dy.as<typename ED::storage>();
        auto* po = dx.as<typename EO::storage>();
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
        for (int64_t i = 0; i < n; ++i) {
          const float v = EX::load(px[i]);
          const float cdf = 0.5f * (1.f + std::erf(v * 0.70710678118654752f));
          const float pdf = 0.39894228040143268f * std::exp(-0.5f * v * v);
          po[i] = EO::store(ED::load(pd[i]) * (cdf + v * pdf));
        }
      });
    });
  });
}

}  // namespace

RT_KERNEL_FAMILY(cpu, activation) {
  table.unary("gelu", kFloatDTypes, gelu, gelu_backward);
  table.unary("gelu_tanh", kFloatDTypes, gelu_tanh, gelu_tanh_backward);
  table.unary("silu", kFloatDTypes, silu, silu_backward);
}

}  // namespace ringtrain::kernels::cpu
