// Our own CUDA kernels for the Llama ops: RMS norm (a warp per row, fp32 statistic; the
// weight's gradient in fixed slices of rows, then summed in order), the elementwise product of
// a gated MLP and its backward, and the rotary pack of grouped-query attention (one thread per
// output element; angles in double as the CPU's, so both round the same cos and sin).
// Formulas follow kernels/cpu (cpu_rmsnorm.cpp, cpu_pointwise.cpp, cpu_rope.cpp) term by term.
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.hpp"

namespace ringtrain::kernels::cuda {
namespace {

constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

unsigned warp_blocks(int64_t rows) {
  return unsigned((rows + kThreads / kWarp - 1) / (kThreads / kWarp));
}

// ---- RMS norm -----------------------------------------------------------------------------

template <typename X, typename Y>
__global__ void rmsnorm_fwd_kernel(const X* x, const float* g, float eps, Y* y, float* rstd,
                                   int64_t rows, int64_t c) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const X* xr = x + r * c;
  float ss = 0.f;
  for (int64_t j = lane; j < c; j += kWarp) ss += ld(xr, j) * ld(xr, j);
  const float rs = 1.f / sqrtf(warp_sum(ss) / float(c) + eps);
  for (int64_t j = lane; j < c; j += kWarp) st(y + r * c, j, ld(xr, j) * rs * g[j]);
  if (lane == 0) rstd[r] = rs;
}

template <typename X, typename D>
__global__ void rmsnorm_dx_kernel(const X* x, const D* dy, const float* g, const float* rstd, D* dx,
                                  int64_t rows, int64_t c) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const float rs = rstd[r];
  float sdx = 0.f;
  for (int64_t j = lane; j < c; j += kWarp) sdx += g[j] * ld(dy, r * c + j) * ld(x, r * c + j);
  sdx = warp_sum(sdx) * rs * rs / float(c);
  for (int64_t j = lane; j < c; j += kWarp)
    st(dx, r * c + j, rs * (g[j] * ld(dy, r * c + j) - ld(x, r * c + j) * sdx));
}

// partial[s, j]: the weight's gradient of column j over the rows of slice s.
template <typename X, typename D>
__global__ void rmsnorm_dweight_kernel(const X* x, const D* dy, const float* rstd, int64_t rows,
                                       int64_t c, float* partial) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t s = blockIdx.y, slices = gridDim.y;
  if (j >= c) return;
  const int64_t per = (rows + slices - 1) / slices;
  const int64_t r0 = s * per, r1 = r0 + per < rows ? r0 + per : rows;
  float a = 0.f;
  for (int64_t r = r0; r < r1; ++r) a += ld(dy, r * c + j) * ld(x, r * c + j) * rstd[r];
  partial[s * c + j] = a;
}

__global__ void sum_slices_kernel(const float* partial, int64_t slices, int64_t c, float* dw) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  float a = 0.f;
  for (int64_t s = 0; s < slices; ++s) a += partial[s * c + j];
  dw[j] = a;
}

// ---- mul ----------------------------------------------------------------------------------

template <typename T, typename Y>
__global__ void mul_kernel(const T* a, const T* b, Y* y, int64_t n) {
  RT_GRID_STRIDE(i, n) st(y, i, ld(a, i) * ld(b, i));
}

template <typename T>
__global__ void mul_bwd_kernel(const T* a, const T* b, const T* dy, T* da, T* db, int64_t n) {
  RT_GRID_STRIDE(i, n) {
    const float g = ld(dy, i);
    st(da, i, g * ld(b, i));
    st(db, i, g * ld(a, i));
  }
}

// ---- rotary pack --------------------------------------------------------------------------

// cos and sin of position p's angle for pair index i < d/2 (rounded from double, as the CPU).
__device__ __forceinline__ void rope_angle(double theta, int64_t p, int64_t i, int64_t d, float* c,
                                           float* s) {
  double sd, cd;
  sincos(double(p) * pow(theta, -2.0 * double(i) / double(d)), &sd, &cd);
  *c = float(cd);
  *s = float(sd);
}

// x (a head of d at `x`) rotated (sign 1) or back (sign -1), element j.
template <typename T>
__device__ __forceinline__ float rotated(const T* x, int64_t j, int64_t d, double theta, int64_t p,
                                         float sign) {
  if (theta == 0) return ld(x, j);
  const int64_t half = d / 2, i = j < half ? j : j - half;
  float c, s;
  rope_angle(theta, p, i, d, &c, &s);
  s *= sign;
  return j < half ? ld(x, j) * c - ld(x, j + half) * s : ld(x, j) * c + ld(x, j - half) * s;
}

// qkv [rows, 3, H, d] from q [rows, H, d], k and v [rows, KV, d].
template <typename T, typename O>
__global__ void rope_pack_kernel(const T* q, const T* k, const T* v, O* qkv, int64_t rows,
                                 int64_t t_len, int64_t h, int64_t kvh, int64_t d, double theta) {
  const int64_t c = h * d, kvc = kvh * d, group = h / kvh;
  RT_GRID_STRIDE(e, rows * 3 * c) {
    const int64_t r = e / (3 * c), rest = e % (3 * c), part = rest / c, head = rest % c / d,
                  j = rest % d, p = r % t_len;
    float val;
    if (part == 0)
      val = rotated(q + r * c + head * d, j, d, theta, p, 1.f);
    else if (part == 1)
      val = rotated(k + r * kvc + head / group * d, j, d, theta, p, 1.f);
    else
      val = ld(v + r * kvc + head / group * d, j);
    st(qkv, e, val);
  }
}

// dq [rows, H, d], dk and dv [rows, KV, d] from dqkv [rows, 3, H, d]: the query heads of a group
// summed in head order.
template <typename T>
__global__ void rope_pack_bwd_kernel(const T* dqkv, T* dq, T* dk, T* dv, int64_t rows,
                                     int64_t t_len, int64_t h, int64_t kvh, int64_t d,
                                     double theta) {
  const int64_t c = h * d, kvc = kvh * d, group = h / kvh, per_row = c + 2 * kvc;
  RT_GRID_STRIDE(e, rows * per_row) {
    const int64_t r = e / per_row, rest = e % per_row, p = r % t_len;
    const T* g = dqkv + r * 3 * c;
    if (rest < c) {
      st(dq, r * c + rest, rotated(g + rest / d * d, rest % d, d, theta, p, -1.f));
      continue;
    }
    const bool is_k = rest < c + kvc;
    const int64_t off = is_k ? rest - c : rest - c - kvc, kv = off / d, j = off % d;
    float a = 0.f;
    for (int64_t i = kv * group; i < (kv + 1) * group; ++i)
      a += is_k ? rotated(g + c + i * d, j, d, theta, p, -1.f) : ld(g + 2 * c + i * d, j);
    st(is_k ? dk : dv, r * kvc + off, a);
  }
}

}  // namespace

void launch_rmsnorm_fwd(const void* x, DType xt, const float* g, float eps, void* y, DType yt,
                        float* rstd, int64_t rows, int64_t c, cudaStream_t s) {
  if (rows == 0) return;
  dispatch(xt, [&](auto X) {
    using TX = typename decltype(X)::type;
    dispatch(yt, [&](auto Y) {
      using TY = typename decltype(Y)::type;
      rmsnorm_fwd_kernel<<<warp_blocks(rows), kThreads, 0, s>>>(static_cast<const TX*>(x), g, eps,
                                                                static_cast<TY*>(y), rstd, rows, c);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_rmsnorm_bwd(const void* x, DType xt, const void* dy, void* dx, DType dt, const float* g,
                        const float* rstd, float* partial, float* dw, int64_t rows, int64_t c,
                        cudaStream_t s) {
  if (rows == 0) return;
  dispatch(xt, [&](auto X) {
    using TX = typename decltype(X)::type;
    dispatch(dt, [&](auto D) {
      using TD = typename decltype(D)::type;
      const auto* px = static_cast<const TX*>(x);
      const auto* pd = static_cast<const TD*>(dy);
      rmsnorm_dx_kernel<<<warp_blocks(rows), kThreads, 0, s>>>(px, pd, g, rstd,
                                                               static_cast<TD*>(dx), rows, c);
      CUDA_CHECK_LAUNCH();
      const dim3 grid(blocks_for(c), kRmsNormSlices);
      rmsnorm_dweight_kernel<<<grid, kThreads, 0, s>>>(px, pd, rstd, rows, c, partial);
      CUDA_CHECK_LAUNCH();
      sum_slices_kernel<<<blocks_for(c), kThreads, 0, s>>>(partial, kRmsNormSlices, c, dw);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_mul(const void* a, const void* b, DType t, void* y, DType yt, int64_t n,
                cudaStream_t s) {
  if (n == 0) return;
  dispatch(t, [&](auto T) {
    using TT = typename decltype(T)::type;
    dispatch(yt, [&](auto Y) {
      using TY = typename decltype(Y)::type;
      mul_kernel<<<blocks_for(n), kThreads, 0, s>>>(
          static_cast<const TT*>(a), static_cast<const TT*>(b), static_cast<TY*>(y), n);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_mul_bwd(const void* a, const void* b, const void* dy, void* da, void* db, DType t,
                    int64_t n, cudaStream_t s) {
  if (n == 0) return;
  dispatch(t, [&](auto T) {
    using TT = typename decltype(T)::type;
    mul_bwd_kernel<<<blocks_for(n), kThreads, 0, s>>>(
        static_cast<const TT*>(a), static_cast<const TT*>(b), static_cast<const TT*>(dy),
        static_cast<TT*>(da), static_cast<TT*>(db), n);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_rope_pack(const void* q, const void* k, const void* v, DType t, void* qkv, DType ot,
                      int64_t rows, int64_t t_len, int64_t heads, int64_t kv_heads,
                      int64_t head_dim, double theta, cudaStream_t s) {
  if (rows == 0) return;
  dispatch(t, [&](auto T) {
    using TT = typename decltype(T)::type;
    dispatch(ot, [&](auto O) {
      using TO = typename decltype(O)::type;
      rope_pack_kernel<<<blocks_for(rows * 3 * heads * head_dim), kThreads, 0, s>>>(
          static_cast<const TT*>(q), static_cast<const TT*>(k), static_cast<const TT*>(v),
          static_cast<TO*>(qkv), rows, t_len, heads, kv_heads, head_dim, theta);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_rope_pack_bwd(const void* dqkv, void* dq, void* dk, void* dv, DType t, int64_t rows,
                          int64_t t_len, int64_t heads, int64_t kv_heads, int64_t head_dim,
                          double theta, cudaStream_t s) {
  if (rows == 0) return;
  dispatch(t, [&](auto T) {
    using TT = typename decltype(T)::type;
    rope_pack_bwd_kernel<<<blocks_for(rows * (heads + 2 * kv_heads) * head_dim), kThreads, 0, s>>>(
        static_cast<const TT*>(dqkv), static_cast<TT*>(dq), static_cast<TT*>(dk),
        static_cast<TT*>(dv), rows, t_len, heads, kv_heads, head_dim, theta);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ringtrain::kernels::cuda
