// Our own CUDA kernels for the MLP path and the training step: cast, fused bias +
// activation, bias gradient, ReLU, softmax cross-entropy (fp32, loss in double), the fused
// unscale + non-finite check, sum of squares, scale, and the fused SGD/AdamW steps over the
// flat master buffer that also write the compute-dtype working copy (one launch for the
// whole buffer). Formulas follow kernels/cpu term by term, and nvcc runs with --fmad=false,
// so elementwise results round like the CPU reference (the optimizers match it bitwise).
// Reductions use a fixed partition and a fixed order: results do not vary between runs.
#include <cmath>

#include "kernels/cuda/argmax_rule.hpp"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.hpp"

namespace ringtrain::kernels::cuda {
namespace {

template <typename S, typename D>
__global__ void cast_kernel(const S* src, D* dst, int64_t n) {
  RT_GRID_STRIDE(i, n) st(dst, i, ld(src, i));
}

template <typename Y, typename B>
__global__ void bias_act_kernel(Y* y, const B* bias, int64_t total, int64_t f, int64_t inner,
                                int act) {
  RT_GRID_STRIDE(i, total) {
    const float v = ld(y, i) + ld(bias, (i / inner) % f);
    st(y, i, act == 1 && v < 0.f ? 0.f : v);  // nan stays nan
  }
}

// partial[s, j] = sum of dy[r, j, 0] over the rows r of slice s, for inner == 1 (a Linear's
// dy [rows, f]): one thread per column j, so a warp reads 32 neighbouring columns of a row.
template <typename T>
__global__ void bias_grad_columns(const T* dy, int64_t rows, int64_t f, float* partial) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t s = blockIdx.y;
  if (j >= f) return;
  const int64_t per = (rows + kBiasGradSlices - 1) / kBiasGradSlices;
  const int64_t r0 = s * per, r1 = r0 + per < rows ? r0 + per : rows;
  float acc = 0.f;
  for (int64_t r = r0; r < r1; ++r) acc += ld(dy, r * f + j);
  partial[s * f + j] = acc;
}

// partial[s, j] = sum of dy[r, j, :] over the rows r of slice s, for inner > 1 (a
// convolution's dy [n, k, p*q]): one block per (channel j, slice s); its threads walk the
// slice's (row, inner) elements of channel j, which lie in contiguous runs of `inner`, so
// neighbouring threads read neighbouring addresses. Each thread's elements and the tree over
// the threads are fixed: the result does not vary between runs.
template <typename T>
__global__ void bias_grad_channels(const T* dy, int64_t rows, int64_t f, int64_t inner,
                                   float* partial) {
  __shared__ float sh[kThreads];
  const int64_t j = blockIdx.x, s = blockIdx.y;
  const int64_t per = (rows + kBiasGradSlices - 1) / kBiasGradSlices;
  const int64_t r0 = s * per, r1 = r0 + per < rows ? r0 + per : rows;
  // Thread t takes elements e = t, t + B, t + 2B, ... of the slice, e = (r - r0) inner + k;
  // (r, k) advance by (B / inner, B % inner) with one carry, no division in the loop.
  const int64_t step_r = blockDim.x / inner, step_k = blockDim.x % inner;
  int64_t r = r0 + threadIdx.x / inner, k = threadIdx.x % inner;
  float acc = 0.f;
  while (r < r1) {
    acc += ld(dy, (r * f + j) * inner + k);
    r += step_r;
    k += step_k;
    if (k >= inner) {
      k -= inner;
      ++r;
    }
  }
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[s * f + j] = sh[0];
}

template <typename D>
__global__ void bias_grad_final(const float* partial, int64_t f, D* db) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= f) return;
  float acc = 0.f;
  for (int s = 0; s < kBiasGradSlices; ++s) acc += partial[s * f + j];
  st(db, j, acc);
}

template <typename T>
__global__ void relu_kernel(const T* x, T* y, int64_t n) {
  RT_GRID_STRIDE(i, n) {
    const float v = ld(x, i);
    if (v > 0.f || isnan(v))
      y[i] = x[i];
    else
      st(y, i, 0.f);
  }
}

template <typename Y, typename D>
__global__ void relu_backward_kernel(const Y* y, const D* dy, D* dx, int64_t n) {
  RT_GRID_STRIDE(i, n) {
    if (ld(y, i) > 0.f)
      dx[i] = dy[i];
    else
      st(dx, i, 0.f);
  }
}

// One warp per row.
// The target is (1 - e) on the label plus e / C everywhere (label smoothing e).
__global__ void xent_kernel(const float* logits, const int32_t* labels, int64_t rows, int64_t c,
                            float g, float e, float* dl, double* row_loss, int32_t* row_correct,
                            int32_t* bad) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;  // uniform across the warp
  const float* x = logits + row * c;
  // The CPU's arg-max (its "x[j] > x[arg]" scan, NaNs included): argmax_rule.hpp.
  ArgMax m;
  for (int64_t j = lane; j < c; j += 32) argmax_visit(m, x[j], j);
  for (int off = 16; off > 0; off >>= 1) {
    ArgMax o;
    o.best = __shfl_xor_sync(0xffffffffu, m.best, off);
    o.arg = __shfl_xor_sync(0xffffffffu, m.arg, off);
    m = argmax_merge(m, o);
  }
  const int64_t arg = argmax_result(m, x[0]);
  const float mx = x[arg];
  double sum = 0;
  for (int64_t j = lane; j < c; j += 32) sum += exp(double(x[j] - mx));
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const double lse = double(mx) + log(sum);
  const double on = 1 - double(e), off = double(e) / double(c);
  double xsum = 0;  // sum of the logits, for the smoothed part of the loss
  if (e != 0.f) {
    for (int64_t j = lane; j < c; j += 32) xsum += double(x[j]);
    for (int off2 = 16; off2 > 0; off2 >>= 1) xsum += __shfl_xor_sync(0xffffffffu, xsum, off2);
  }
  const int32_t label = labels[row];
  const bool ok = label >= 0 && label < c;
  if (lane == 0) {
    if (!ok) *bad = 1;
    row_loss[row] = ok ? lse - on * double(x[label]) - off * xsum : 0.0;
    row_correct[row] = arg == label;
  }
  if (!dl) return;
  for (int64_t j = lane; j < c; j += 32) {
    const float p = float(exp(double(x[j]) - lse));
    dl[row * c + j] = (p - float((j == label ? on : 0.0) + off)) * g;
  }
}

template <typename T>
__global__ void unscale_kernel(const T* in, float factor, float* out, int64_t n, int32_t* flag) {
  bool bad = false;
  RT_GRID_STRIDE(i, n) {
    const float v = ld(in, i) * factor;
    bad |= !isfinite(v);
    if (out) out[i] = v;
  }
  if (bad) *flag = 1;  // every writer writes the same value: no atomic needed
}

__global__ void sum_squares_partial(const float* x, int64_t n, double* partial) {
  __shared__ double sh[kThreads];
  const int64_t chunk = (n + kSumSlices - 1) / kSumSlices;
  const int64_t lo = int64_t(blockIdx.x) * chunk;
  const int64_t hi = lo + chunk < n ? lo + chunk : n;
  double s = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) s += double(x[i]) * x[i];
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}

__global__ void sum_final(const double* partial, int parts, double* result) {
  __shared__ double sh[kSumSlices];
  for (int i = threadIdx.x; i < kSumSlices; i += blockDim.x) sh[i] = i < parts ? partial[i] : 0;
  __syncthreads();
  for (int w = kSumSlices / 2; w > 0; w >>= 1) {
    for (int i = threadIdx.x; i < w; i += blockDim.x) sh[i] += sh[i + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *result = sh[0];
}

__global__ void scale_kernel(float* x, int64_t n, float factor) {
  RT_GRID_STRIDE(i, n) x[i] *= factor;
}

template <typename W>
__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ g,
                           float* __restrict__ m, int64_t n, float lr, float mu, float wd,
                           bool nesterov, W* __restrict__ work) {
  RT_GRID_STRIDE(i, n) {
    float pi = p[i];
    if (!m) {
      pi -= lr * (g[i] + wd * pi);
    } else if (nesterov) {
      const float d = g[i] + wd * pi;
      const float mi = mu * m[i] + d;
      m[i] = mi;
      pi -= lr * (d + mu * mi);
    } else {
      const float mi = mu * m[i] + (g[i] + wd * pi);
      m[i] = mi;
      pi -= lr * mi;
    }
    p[i] = pi;
    if (work) st(work, i, pi);
  }
}

template <typename W>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g,
                             float* __restrict__ m, float* __restrict__ v, int64_t n, float b1,
                             float b2, float eps, float step_size, float bc2_sqrt, float decay,
                             W* __restrict__ work) {
  RT_GRID_STRIDE(i, n) {
    const float gi = g[i];
    const float mi = b1 * m[i] + (1.f - b1) * gi;
    const float vi = b2 * v[i] + (1.f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    p[i] = pi;
    if (work) st(work, i, pi);
  }
}

template <typename A, typename B, typename Y>
__global__ void add_kernel(const A* a, const B* b, Y* y, int64_t n) {
  RT_GRID_STRIDE(i, n) st(y, i, ld(a, i) + ld(b, i));
}

}  // namespace

void launch_cast(const void* src, DType st_, void* dst, DType dt, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  dispatch(st_, [&](auto S) {
    using TS = typename decltype(S)::type;
    dispatch(dt, [&](auto D) {
      using TD = typename decltype(D)::type;
      cast_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const TS*>(src),
                                                     static_cast<TD*>(dst), n);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_bias_act(void* y, DType yt, const void* bias, DType bt, int64_t rows, int64_t f,
                     int64_t inner, int act, cudaStream_t s) {
  const int64_t total = rows * f * inner;
  if (total == 0) return;
  dispatch(yt, [&](auto Y) {
    using TY = typename decltype(Y)::type;
    dispatch(bt, [&](auto B) {
      using TB = typename decltype(B)::type;
      bias_act_kernel<<<blocks_for(total), kThreads, 0, s>>>(
          static_cast<TY*>(y), static_cast<const TB*>(bias), total, f, inner, act);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_bias_grad(const void* dy, DType t, int64_t rows, int64_t f, int64_t inner,
                      float* partial, void* db, DType dbt, cudaStream_t s) {
  if (f == 0) return;
  dispatch(t, [&](auto T) {
    using TT = typename decltype(T)::type;
    if (inner == 1) {
      const dim3 grid(unsigned((f + kThreads - 1) / kThreads), kBiasGradSlices);
      bias_grad_columns<<<grid, kThreads, 0, s>>>(static_cast<const TT*>(dy), rows, f, partial);
    } else {
      const dim3 grid(unsigned(f), kBiasGradSlices);
      bias_grad_channels<<<grid, kThreads, 0, s>>>(static_cast<const TT*>(dy), rows, f, inner,
                                                   partial);
    }
    CUDA_CHECK_LAUNCH();
  });
  dispatch(dbt, [&](auto D) {
    using TD = typename decltype(D)::type;
    bias_grad_final<<<unsigned((f + kThreads - 1) / kThreads), kThreads, 0, s>>>(
        partial, f, static_cast<TD*>(db));
    CUDA_CHECK_LAUNCH();
  });
}

void launch_relu(const void* x, void* y, DType t, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  dispatch(t, [&](auto T) {
    using TT = typename decltype(T)::type;
    relu_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const TT*>(x), static_cast<TT*>(y),
                                                   n);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_relu_backward(const void* y, DType yt, const void* dy, void* dx, DType dt, int64_t n,
                          cudaStream_t s) {
  if (n == 0) return;
  dispatch(yt, [&](auto Y) {
    using TY = typename decltype(Y)::type;
    dispatch(dt, [&](auto D) {
      using TD = typename decltype(D)::type;
      relu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(
          static_cast<const TY*>(y), static_cast<const TD*>(dy), static_cast<TD*>(dx), n);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_softmax_xent(const float* logits, const int32_t* labels, int64_t rows, int64_t c,
                         float g, float smoothing, float* dlogits, double* row_loss,
                         int32_t* row_correct, int32_t* bad_label, cudaStream_t s) {
  if (rows == 0) return;
  constexpr int kRowsPerBlock = kThreads / 32;
  xent_kernel<<<unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock), kThreads, 0, s>>>(
      logits, labels, rows, c, g, smoothing, dlogits, row_loss, row_correct, bad_label);
  CUDA_CHECK_LAUNCH();
}

void launch_unscale_check(const void* in, DType t, float factor, float* out, int64_t n,
                          int32_t* flag, cudaStream_t s) {
  if (n == 0) return;
  dispatch(t, [&](auto T) {
    using TT = typename decltype(T)::type;
    unscale_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const TT*>(in), factor, out, n,
                                                      flag);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_sum_squares(const float* x, int64_t n, double* partial, double* result,
                        cudaStream_t s) {
  sum_squares_partial<<<kSumSlices, kThreads, 0, s>>>(x, n, partial);
  CUDA_CHECK_LAUNCH();
  sum_final<<<1, kThreads, 0, s>>>(partial, kSumSlices, result);
  CUDA_CHECK_LAUNCH();
}

void launch_scale(float* x, int64_t n, float factor, cudaStream_t s) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, factor);
  CUDA_CHECK_LAUNCH();
}

void launch_sgd(float* p, const float* g, float* m, int64_t n, float lr, float mu, float wd,
                bool nesterov, void* work, DType wt, cudaStream_t s) {
  if (n == 0) return;
  dispatch(wt, [&](auto W) {
    using TW = typename decltype(W)::type;
    sgd_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, g, m, n, lr, mu, wd, nesterov,
                                                  static_cast<TW*>(work));
    CUDA_CHECK_LAUNCH();
  });
}

void launch_adamw(float* p, const float* g, float* m, float* v, int64_t n, float b1, float b2,
                  float eps, float step_size, float bc2_sqrt, float decay, void* work, DType wt,
                  cudaStream_t s) {
  if (n == 0) return;
  dispatch(wt, [&](auto W) {
    using TW = typename decltype(W)::type;
    adamw_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, g, m, v, n, b1, b2, eps, step_size, bc2_sqrt,
                                                    decay, static_cast<TW*>(work));
    CUDA_CHECK_LAUNCH();
  });
}

void launch_add(const void* a, DType at, const void* b, DType bt, void* y, DType yt, int64_t n,
                cudaStream_t s) {
  if (n == 0) return;
  dispatch(at, [&](auto A) {
    using TA = typename decltype(A)::type;
    dispatch(bt, [&](auto B) {
      using TB = typename decltype(B)::type;
      dispatch(yt, [&](auto Y) {
        using TY = typename decltype(Y)::type;
        add_kernel<<<blocks_for(n), kThreads, 0, s>>>(
            static_cast<const TA*>(a), static_cast<const TB*>(b), static_cast<TY*>(y), n);
        CUDA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace ringtrain::kernels::cuda
