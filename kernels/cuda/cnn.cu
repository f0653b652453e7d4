// Our own CUDA kernels of the CNN layers: max pooling (argmax kept; the backward pass
// gathers, so no atomics), global average pooling, batch normalisation (per-channel
// statistics in double, one block per channel, a fixed reduction tree), dropout with
// the counter-based hash of kernels.hpp (masks bit-identical to the CPU's). The residual
// add is in elementwise.cu. Formulas follow kernels/cpu/cpu_batchnorm.cpp and cpu_conv.cpp.
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain::kernels::cuda {
namespace {

template <typename T>
__global__ void maxpool_fwd(const T* x, T* y, int32_t* argmax, int64_t planes, int64_t h, int64_t w,
                            int64_t P, int64_t Q, int64_t k, int64_t stride, bool relu_input) {
  RT_GRID_STRIDE(o, planes * P * Q) {
    const int64_t pl = o / (P * Q), p = o / Q % P, q = o % Q;
    const T* in = x + pl * h * w;
    int64_t best = p * stride * w + q * stride;
    float bv = ld(in, best);
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t at = (p * stride + i) * w + q * stride + j;
        const float v = ld(in, at);
        if (v > bv || (v != v && bv == bv)) {  // a nan wins, so it is not hidden
          bv = v;
          best = at;
        }
      }
    y[o] = in[best];
    argmax[o] = relu_input && bv <= 0.f ? -1 : int32_t(best);  // see PoolShape::relu_input
  }
}

// dx[pl, at] = sum of dy over the windows whose argmax is `at`, in window order (as the
// CPU's scatter in output order), accumulated in fp32.
template <typename T>
__global__ void maxpool_bwd(const T* dy, const int32_t* argmax, T* dx, int64_t planes, int64_t h,
                            int64_t w, int64_t P, int64_t Q, int64_t k, int64_t stride) {
  RT_GRID_STRIDE(e, planes * h * w) {
    const int64_t pl = e / (h * w), at = e % (h * w), ih = at / w, iw = at % w;
    // Windows p with p*stride <= ih < p*stride + k.
    const int64_t p_lo = ih - k + 1 > 0 ? (ih - k + 1 + stride - 1) / stride : 0;
    const int64_t p_hi = ih / stride < P - 1 ? ih / stride : P - 1;
    const int64_t q_lo = iw - k + 1 > 0 ? (iw - k + 1 + stride - 1) / stride : 0;
    const int64_t q_hi = iw / stride < Q - 1 ? iw / stride : Q - 1;
    float acc = 0.f;
    for (int64_t p = p_lo; p <= p_hi; ++p)
      for (int64_t q = q_lo; q <= q_hi; ++q) {
        const int64_t o = pl * P * Q + p * Q + q;
        if (argmax[o] == at) acc += ld(dy, o);
      }
    st(dx, e, acc);
  }
}

// One thread per plane, summed in order like the CPU (planes are many, H*W small).
template <typename X, typename Y>
__global__ void avgpool_fwd(const X* x, Y* y, int64_t planes, int64_t hw) {
  RT_GRID_STRIDE(pl, planes) {
    float s = 0.f;
    for (int64_t i = 0; i < hw; ++i) s += ld(x, pl * hw + i);
    st(y, pl, s / float(hw));
  }
}

template <typename D, typename X>
__global__ void avgpool_bwd(const D* dy, X* dx, int64_t planes, int64_t hw) {
  RT_GRID_STRIDE(e, planes * hw) st(dx, e, ld(dy, e / hw) / float(hw));
}

// Block-wide sum of a double in a fixed tree (blockDim.x == kThreads).
__device__ double block_sum(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

// One block per channel: statistics (training) or the running ones, then y.
template <typename X, typename Y>
__global__ void bn_fwd(const X* x, Y* y, int64_t n, int64_t c, int64_t hw, const float* gamma,
                       const float* beta, float* rm, float* rv, float* mean, float* invstd,
                       bool training, float momentum, float eps) {
  __shared__ double sh[kThreads];
  const int64_t ch = blockIdx.x, m = n * hw;
  float mu, is;
  if (training) {
    double s = 0;
    for (int64_t e = threadIdx.x; e < m; e += blockDim.x)
      s += ld(x, ((e / hw) * c + ch) * hw + e % hw);
    const double mu_d = block_sum(s, sh) / double(m);
    double ss = 0;
    for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
      const double v = double(ld(x, ((e / hw) * c + ch) * hw + e % hw)) - mu_d;
      ss += v * v;
    }
    ss = block_sum(ss, sh);
    const double var = ss / double(m);
    mu = float(mu_d);
    is = float(1.0 / sqrt(var + double(eps)));
    const double unbiased = m > 1 ? ss / double(m - 1) : var;
    if (threadIdx.x == 0) {
      rm[ch] = float((1.0 - momentum) * rm[ch] + momentum * mu_d);
      rv[ch] = float((1.0 - momentum) * rv[ch] + momentum * unbiased);
    }
  } else {
    mu = rm[ch];
    is = float(1.0 / sqrt(double(rv[ch]) + double(eps)));
  }
  if (threadIdx.x == 0) {
    mean[ch] = mu;
    invstd[ch] = is;
  }
  const float scale = gamma[ch] * is, shift = beta[ch] - mu * scale;
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
    const int64_t o = ((e / hw) * c + ch) * hw + e % hw;
    st(y, o, ld(x, o) * scale + shift);
  }
}

template <typename X, typename D, typename O>
__global__ void bn_bwd(const X* x, const D* dy, O* dx, int64_t n, int64_t c, int64_t hw,
                       const float* gamma, const float* mean, const float* invstd, float* dgamma,
                       float* dbeta, bool training) {
  __shared__ double sh[kThreads];
  const int64_t ch = blockIdx.x, m = n * hw;
  const float mu = mean[ch], is = invstd[ch];
  double sdy = 0, sdyx = 0;
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
    const int64_t o = ((e / hw) * c + ch) * hw + e % hw;
    const double gy = ld(dy, o);
    sdy += gy;
    sdyx += gy * (double(ld(x, o)) - mu) * is;
  }
  sdy = block_sum(sdy, sh);
  sdyx = block_sum(sdyx, sh);
  if (threadIdx.x == 0) {
    dbeta[ch] = float(sdy);
    dgamma[ch] = float(sdyx);
  }
  const float k = gamma[ch] * is;
  const float a = training ? float(sdy / double(m)) : 0.f;
  const float bq = training ? float(sdyx / double(m)) : 0.f;
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
    const int64_t o = ((e / hw) * c + ch) * hw + e % hw;
    const float xhat = (ld(x, o) - mu) * is;
    st(dx, o, k * (ld(dy, o) - a - xhat * bq));
  }
}

template <typename T>
__global__ void dropout_fwd(const T* x, T* y, uint8_t* mask, int64_t n, float p, float keep_scale,
                            uint64_t seed) {
  RT_GRID_STRIDE(i, n) {
    const bool keep = dropout_uniform(seed, uint64_t(i)) >= p;
    mask[i] = keep;
    st(y, i, keep ? ld(x, i) * keep_scale : 0.f);
  }
}

template <typename T>
__global__ void dropout_bwd(const T* dy, const uint8_t* mask, T* dx, int64_t n, float keep_scale) {
  RT_GRID_STRIDE(i, n) st(dx, i, mask[i] ? ld(dy, i) * keep_scale : 0.f);
}

}  // namespace

void launch_maxpool_fwd(const void* x, void* y, int32_t* argmax, DType t, int64_t planes, int64_t h,
                        int64_t w, int64_t p, int64_t q, int64_t k, int64_t stride, bool relu_input,
                        cudaStream_t s) {
  dispatch(t, [&](auto T) {
    using TT = typename decltype(T)::type;
    maxpool_fwd<<<blocks_for(planes * p * q), kThreads, 0, s>>>(static_cast<const TT*>(x),
                                                                static_cast<TT*>(y), argmax, planes,
                                                                h, w, p, q, k, stride, relu_input);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_maxpool_bwd(const void* dy, const int32_t* argmax, void* dx, DType t, int64_t planes,
                        int64_t h, int64_t w, int64_t p, int64_t q, int64_t k, int64_t stride,
                        cudaStream_t s) {
  dispatch(t, [&](auto T) {
    using TT = typename decltype(T)::type;
    maxpool_bwd<<<blocks_for(planes * h * w), kThreads, 0, s>>>(
        static_cast<const TT*>(dy), argmax, static_cast<TT*>(dx), planes, h, w, p, q, k, stride);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_avgpool_fwd(const void* x, void* y, DType xt, DType yt, int64_t planes, int64_t hw,
                        cudaStream_t s) {
  dispatch(xt, [&](auto X) {
    using TX = typename decltype(X)::type;
    dispatch(yt, [&](auto Y) {
      using TY = typename decltype(Y)::type;
      avgpool_fwd<<<blocks_for(planes), kThreads, 0, s>>>(static_cast<const TX*>(x),
                                                          static_cast<TY*>(y), planes, hw);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_avgpool_bwd(const void* dy, DType dt, void* dx, DType xt, int64_t planes, int64_t hw,
                        cudaStream_t s) {
  dispatch(dt, [&](auto D) {
    using TD = typename decltype(D)::type;
    dispatch(xt, [&](auto X) {
      using TX = typename decltype(X)::type;
      avgpool_bwd<<<blocks_for(planes * hw), kThreads, 0, s>>>(static_cast<const TD*>(dy),
                                                               static_cast<TX*>(dx), planes, hw);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_bn_forward(const void* x, DType xt, void* y, DType yt, int64_t n, int64_t c, int64_t hw,
                       const float* gamma, const float* beta, float* running_mean,
                       float* running_var, float* mean, float* invstd, bool training,
                       float momentum, float eps, cudaStream_t s) {
  if (c == 0) return;
  dispatch(xt, [&](auto X) {
    using TX = typename decltype(X)::type;
    dispatch(yt, [&](auto Y) {
      using TY = typename decltype(Y)::type;
      bn_fwd<<<unsigned(c), kThreads, 0, s>>>(static_cast<const TX*>(x), static_cast<TY*>(y), n, c,
                                              hw, gamma, beta, running_mean, running_var, mean,
                                              invstd, training, momentum, eps);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_bn_backward(const void* x, const void* dy, void* dx, DType xt, DType dyt, DType dxt,
                        int64_t n, int64_t c, int64_t hw, const float* gamma, const float* mean,
                        const float* invstd, float* dgamma, float* dbeta, bool training,
                        cudaStream_t s) {
  if (c == 0) return;
  dispatch(xt, [&](auto X) {
    using TX = typename decltype(X)::type;
    dispatch(dyt, [&](auto D) {
      using TD = typename decltype(D)::type;
      dispatch(dxt, [&](auto O) {
        using TO = typename decltype(O)::type;
        bn_bwd<<<unsigned(c), kThreads, 0, s>>>(
            static_cast<const TX*>(x), static_cast<const TD*>(dy), static_cast<TO*>(dx), n, c, hw,
            gamma, mean, invstd, dgamma, dbeta, training);
        CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void launch_dropout_fwd(const void* x, void* y, uint8_t* mask, DType t, int64_t n, float p,
                        uint64_t seed, cudaStream_t s) {
  if (n == 0) return;
  const float keep_scale = 1.f / (1.f - p);
  dispatch(t, [&](auto T) {
    using TT = typename decltype(T)::type;
    dropout_fwd<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const TT*>(x), static_cast<TT*>(y),
                                                   mask, n, p, keep_scale, seed);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_dropout_bwd(const void* dy, const uint8_t* mask, void* dx, DType t, int64_t n, float p,
                        cudaStream_t s) {
  if (n == 0) return;
  const float keep_scale = 1.f / (1.f - p);
  dispatch(t, [&](auto T) {
    using TT = typename decltype(T)::type;
    dropout_bwd<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const TT*>(dy), mask,
                                                   static_cast<TT*>(dx), n, keep_scale);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ringtrain::kernels::cuda
