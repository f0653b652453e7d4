// The CUDA activation family: the pointwise kernels of the kernel table (kernel_table.hpp) —
// GELU exact (erf), GELU in GPT-2's tanh form and SiLU — as one grid-stride kernel template
// over a functor per activation, and their registration. Formulas follow
// kernels/cpu/cpu_activation.cpp term by term (built with --fmad=false, so they round as the
// CPU's scalar code does). An activation added here needs no other CUDA file.
#include <cmath>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/families.hpp"
#include "kernels/kernel_table.hpp"

namespace ringtrain::kernels::cuda {
namespace {

// Each activation: forward(v) = f(v), grad(v) = f'(v) (the backward pass multiplies by dy).
struct Gelu {
  __device__ static float forward(float v) {
    return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
  }
  __device__ static float grad(float v) {
    const float cdf = 0.5f * (1.f + erff(v * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
    return cdf + v * pdf;
  }
};

constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;

struct GeluTanh {
  // 0.5 (1 + tanh(u)) = sigmoid(2u), as the CPU kernel computes it.
  __device__ static float sigmoid2u(float v) {
    return 1.f / (1.f + expf(-2.f * kSqrt2OverPi * (v + kCubic * v * v * v)));
  }
  __device__ static float forward(float v) { return v * sigmoid2u(v); }
  __device__ static float grad(float v) {
    const float sg = sigmoid2u(v);
    return sg + v * 2.f * sg * (1.f - sg) * kSqrt2OverPi * (1.f + 3.f * kCubic * v * v);
  }
};

// x sigmoid(x); d/dx = s (1 + x (1 - s)).
struct Silu {
  __device__ static float forward(float v) { return v / (1.f + expf(-v)); }
  __device__ static float grad(float v) {
    const float s = 1.f / (1.f + expf(-v));
    return s * (1.f + v * (1.f - s));
  }
};

template <class F, typename X, typename Y>
__global__ void unary_forward_kernel(const X* x, Y* y, int64_t n) {
  RT_GRID_STRIDE(i, n) { st(y, i, F::forward(ld(x, i))); }
}

template <class F, typename X, typename D, typename O>
__global__ void unary_backward_kernel(const X* x, const D* dy, O* dx, int64_t n) {
  RT_GRID_STRIDE(i, n) {
    const float g = F::grad(ld(x, i));
    st(dx, i, ld(dy, i) * g);
  }
}

template <class F>
void unary_forward(const KernelEnv& env, const Tensor& x, const Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(env.stream);
  dispatch(x.dtype, [&](auto X) {
    using TX = typename decltype(X)::type;
    dispatch(y.dtype, [&](auto Y) {
      using TY = typename decltype(Y)::type;
      unary_forward_kernel<F><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const TX*>(x.data),
                                                                 static_cast<TY*>(y.data), n);
      CUDA_CHECK_LAUNCH();
    });
  });
}

template <class F>
void unary_backward(const KernelEnv& env, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(env.stream);
  dispatch(x.dtype, [&](auto X) {
    using TX = typename decltype(X)::type;
    dispatch(dy.dtype, [&](auto D) {
      using TD = typename decltype(D)::type;
      dispatch(dx.dtype, [&](auto O) {
        using TO = typename decltype(O)::type;
        unary_backward_kernel<F><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const TX*>(x.data),
                                                                    static_cast<const TD*>(dy.data),
                                                                    static_cast<TO*>(dx.data), n);
        CUDA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace

RT_KERNEL_FAMILY(cuda, activation) {
  table.unary("gelu", kFloatDTypes, unary_forward<Gelu>, unary_backward<Gelu>);
  table.unary("gelu_tanh", kFloatDTypes, unary_forward<GeluTanh>, unary_backward<GeluTanh>);
  table.unary("silu", kFloatDTypes, unary_forward<Silu>, unary_backward<Silu>);
}

}  // namespace ringtrain::kernels::cuda
