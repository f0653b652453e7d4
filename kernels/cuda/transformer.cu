// Our own CUDA kernels for the transformer ops: token + positional embedding's gather (its
// backward pass is embedding_backward.cu), layer norm
// (a warp per row, fp32 statistics; parameter gradients in fixed slices, then summed in
// order), causal self-attention fused as FlashAttention (a warp per query row, an online
// softmax over its keys, 32 keys at a time, one per lane; backward recomputes the
// probabilities from the saved log-sum-exp: one pass per query for dq, one per key for dk and
// dv, so no atomics and no T x T matrix) and the fused token cross-entropy
// over a padded vocabulary (a block per row). Formulas follow kernels/cpu term by term.
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.hpp"

namespace ringtrain::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxLaneDims = 8;  // head size up to 256: 8 dimensions per lane
// The backend refuses head sizes above kMaxAttentionHeadSize (launch.hpp); a lane's
// registers hold kMaxLaneDims of them, so the two must agree or dimensions would be dropped.
static_assert(kMaxLaneDims * kWarp == kMaxAttentionHeadSize, "attention head-size limit");
// The backward pass's dynamic shared memory (two rows of the head size per warp) must fit
// the 48 KiB a launch gets without opting in.
static_assert((kThreads / kWarp) * 2 * kMaxAttentionHeadSize * sizeof(float) <= 48 * 1024,
              "attention shared memory");

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// ---- embedding ----------------------------------------------------------------------------

template <typename W, typename Y>
__global__ void embedding_fwd_kernel(const int32_t* tok, const W* wte, const W* wpe, Y* y,
                                     int64_t n, int64_t t_len, int64_t c) {
  RT_GRID_STRIDE(i, n * c) {
    const int64_t row = i / c, j = i % c;
    float v = ld(wte, int64_t(tok[row]) * c + j);
    if (wpe) v += ld(wpe, (row % t_len) * c + j);
    st(y, i, v);
  }
}

// ---- layer norm ---------------------------------------------------------------------------

template <typename X, typename Y>
__global__ void layernorm_fwd_kernel(const X* x, const float* g, const float* b, float eps, Y* y,
                                     float* mean, float* rstd, int64_t rows, int64_t c) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const X* xr = x + r * c;
  float s = 0.f;
  for (int64_t j = lane; j < c; j += kWarp) s += ld(xr, j);
  const float mu = warp_sum(s) / float(c);
  float ss = 0.f;
  for (int64_t j = lane; j < c; j += kWarp) {
    const float d = ld(xr, j) - mu;
    ss += d * d;
  }
  const float rs = 1.f / sqrtf(warp_sum(ss) / float(c) + eps);
  for (int64_t j = lane; j < c; j += kWarp) st(y + r * c, j, (ld(xr, j) - mu) * rs * g[j] + b[j]);
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

template <typename X, typename D>
__global__ void layernorm_dx_kernel(const X* x, const D* dy, const float* g, const float* mean,
                                    const float* rstd, D* dx, int64_t rows, int64_t c) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const float mu = mean[r], rs = rstd[r];
  float sd = 0.f, sdx = 0.f;
  for (int64_t j = lane; j < c; j += kWarp) {
    const float dn = g[j] * ld(dy, r * c + j);
    sd += dn;
    sdx += dn * (ld(x, r * c + j) - mu) * rs;
  }
  sd = warp_sum(sd) / float(c);
  sdx = warp_sum(sdx) / float(c);
  for (int64_t j = lane; j < c; j += kWarp) {
    const float xhat = (ld(x, r * c + j) - mu) * rs;
    st(dx, r * c + j, rs * (g[j] * ld(dy, r * c + j) - sd - xhat * sdx));
  }
}

// partial[s, j] and partial[S + s, j]: dgamma and dbeta of column j over the rows of slice s.
template <typename X, typename D>
__global__ void layernorm_dparam_kernel(const X* x, const D* dy, const float* mean,
                                        const float* rstd, int64_t rows, int64_t c,
                                        float* partial) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t s = blockIdx.y, slices = gridDim.y;
  if (j >= c) return;
  const int64_t per = (rows + slices - 1) / slices;
  const int64_t r0 = s * per, r1 = r0 + per < rows ? r0 + per : rows;
  float ag = 0.f, ab = 0.f;
  for (int64_t r = r0; r < r1; ++r) {
    const float d = ld(dy, r * c + j);
    ag += d * (ld(x, r * c + j) - mean[r]) * rstd[r];
    ab += d;
  }
  partial[s * c + j] = ag;
  partial[(slices + s) * c + j] = ab;
}

__global__ void sum_slices_kernel(const float* partial, int64_t slices, int64_t c, float* dg,
                                  float* db) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  float ag = 0.f, ab = 0.f;
  for (int64_t s = 0; s < slices; ++s) {
    ag += partial[s * c + j];
    ab += partial[(slices + s) * c + j];
  }
  dg[j] = ag;
  db[j] = ab;
}

// ---- attention ----------------------------------------------------------------------------

// Where head h's q (part 0), k (1) or v (2) of token t starts in qkv [B, T, 3C].
__device__ __forceinline__ int64_t qkv_at(int64_t b, int64_t t, int64_t t_len, int64_t c, int part,
                                          int64_t h, int64_t hs) {
  return (b * t_len + t) * 3 * c + part * c + h * hs;
}

// A warp per (b, h, query i). Lane l scores key j0 + l against q (held in shared memory);
// the warp then updates the running maximum, sum and output (lane l owns dimensions l,
// l + 32, ...).
template <typename T>
__global__ void attention_fwd_kernel(const T* qkv, T* out, float* lse, int64_t bsz, int64_t t_len,
                                     int64_t heads, int64_t hs, float scale) {
  extern __shared__ float smem[];
  const int warps = blockDim.x / kWarp, w = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = int64_t(blockIdx.x) * warps + w;  // (b, h, i) flattened
  if (row >= bsz * heads * t_len) return;
  const int64_t i = row % t_len, h = (row / t_len) % heads, b = row / (t_len * heads);
  const int64_t c = heads * hs;
  float* q = smem + w * hs;
  for (int64_t d = lane; d < hs; d += kWarp) q[d] = ld(qkv, qkv_at(b, i, t_len, c, 0, h, hs) + d);
  __syncwarp();
  float acc[kMaxLaneDims];
  for (int k = 0; k < kMaxLaneDims; ++k) acc[k] = 0.f;
  float m = -INFINITY, l = 0.f;
  for (int64_t j0 = 0; j0 <= i; j0 += kWarp) {
    const int64_t j = j0 + lane;
    float s = -INFINITY;
    if (j <= i) {
      const int64_t kb = qkv_at(b, j, t_len, c, 1, h, hs);
      float dot = 0.f;
      for (int64_t d = 0; d < hs; ++d) dot += q[d] * ld(qkv, kb + d);
      s = dot * scale;
    }
    const float mx = fmaxf(m, warp_max(s));
    const float p = j <= i ? expf(s - mx) : 0.f;
    const float corr = expf(m - mx);
    l = l * corr + warp_sum(p);
    m = mx;
    for (int k = 0; k < kMaxLaneDims; ++k) acc[k] *= corr;
    const int64_t n = i - j0 + 1 < kWarp ? i - j0 + 1 : kWarp;
    for (int jj = 0; jj < n; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      const int64_t vb = qkv_at(b, j0 + jj, t_len, c, 2, h, hs);
      for (int k = 0; k < kMaxLaneDims; ++k) {
        const int64_t d = lane + k * kWarp;
        if (d < hs) acc[k] += pj * ld(qkv, vb + d);
      }
    }
  }
  const int64_t ob = (b * t_len + i) * c + h * hs;
  for (int k = 0; k < kMaxLaneDims; ++k) {
    const int64_t d = lane + k * kWarp;
    if (d < hs) st(out, ob + d, acc[k] / l);
  }
  if (lane == 0) lse[row] = m + logf(l);
}

// delta[(b, h, i)] = dout_i . out_i over the head's dimensions.
template <typename T>
__global__ void attention_delta_kernel(const T* out, const T* dout, float* delta, int64_t bsz,
                                       int64_t t_len, int64_t heads, int64_t hs) {
  const int warps = blockDim.x / kWarp, w = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = int64_t(blockIdx.x) * warps + w;
  if (row >= bsz * heads * t_len) return;
  const int64_t i = row % t_len, h = (row / t_len) % heads, b = row / (t_len * heads);
  const int64_t ob = (b * t_len + i) * heads * hs + h * hs;
  float s = 0.f;
  for (int64_t d = lane; d < hs; d += kWarp) s += ld(out, ob + d) * ld(dout, ob + d);
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

// mode 0: a warp per query i, dq_i = scale sum_j ds_ij k_j over keys j <= i.
// mode 1: a warp per key j, dk_j = scale sum_i ds_ij q_i and dv_j = sum_i p_ij dout_i over
// queries i >= j. Both recompute p_ij = exp(s_ij - lse_i) and ds_ij = p_ij (dp_ij - delta_i).
template <typename T, int kMode>
__global__ void attention_bwd_kernel(const T* qkv, const T* dout, const float* lse,
                                     const float* delta, T* dqkv, int64_t bsz, int64_t t_len,
                                     int64_t heads, int64_t hs, float scale) {
  extern __shared__ float smem[];
  const int warps = blockDim.x / kWarp, w = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = int64_t(blockIdx.x) * warps + w;
  if (row >= bsz * heads * t_len) return;
  const int64_t me = row % t_len, h = (row / t_len) % heads, b = row / (t_len * heads);
  const int64_t c = heads * hs, lrow = row - me;  // lse/delta index of (b, h, 0)
  // Mode 0 holds q_i and dout_i; mode 1 holds k_j and v_j.
  float* a = smem + w * 2 * hs;
  float* a2 = a + hs;
  for (int64_t d = lane; d < hs; d += kWarp) {
    if (kMode == 0) {
      a[d] = ld(qkv, qkv_at(b, me, t_len, c, 0, h, hs) + d);
      a2[d] = ld(dout, (b * t_len + me) * c + h * hs + d);
    } else {
      a[d] = ld(qkv, qkv_at(b, me, t_len, c, 1, h, hs) + d);
      a2[d] = ld(qkv, qkv_at(b, me, t_len, c, 2, h, hs) + d);
    }
  }
  __syncwarp();
  float acc[kMaxLaneDims], acc2[kMaxLaneDims];
  for (int k = 0; k < kMaxLaneDims; ++k) acc[k] = acc2[k] = 0.f;
  const int64_t lo = kMode == 0 ? 0 : me, hi = kMode == 0 ? me + 1 : t_len;  // partners
  for (int64_t p0 = lo; p0 < hi; p0 += kWarp) {
    const int64_t other = p0 + lane;
    float p = 0.f, ds = 0.f;
    if (other < hi) {
      const int64_t i = kMode == 0 ? me : other, j = kMode == 0 ? other : me;
      float s = 0.f, dp = 0.f;
      if (kMode == 0) {
        const int64_t kb = qkv_at(b, j, t_len, c, 1, h, hs), vb = qkv_at(b, j, t_len, c, 2, h, hs);
        for (int64_t d = 0; d < hs; ++d) {
          s += a[d] * ld(qkv, kb + d);
          dp += a2[d] * ld(qkv, vb + d);
        }
      } else {
        const int64_t qb = qkv_at(b, i, t_len, c, 0, h, hs), ob = (b * t_len + i) * c + h * hs;
        for (int64_t d = 0; d < hs; ++d) {
          s += ld(qkv, qb + d) * a[d];
          dp += ld(dout, ob + d) * a2[d];
        }
      }
      p = expf(s * scale - lse[lrow + i]);
      ds = p * (dp - delta[lrow + i]) * scale;
    }
    const int64_t n = hi - p0 < kWarp ? hi - p0 : kWarp;
    for (int jj = 0; jj < n; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      const float dsj = __shfl_sync(0xffffffffu, ds, jj);
      const int64_t o = p0 + jj;
      for (int k = 0; k < kMaxLaneDims; ++k) {
        const int64_t d = lane + k * kWarp;
        if (d >= hs) continue;
        if (kMode == 0) {
          acc[k] += dsj * ld(qkv, qkv_at(b, o, t_len, c, 1, h, hs) + d);
        } else {
          acc[k] += dsj * ld(qkv, qkv_at(b, o, t_len, c, 0, h, hs) + d);
          acc2[k] += pj * ld(dout, (b * t_len + o) * c + h * hs + d);
        }
      }
    }
  }
  for (int k = 0; k < kMaxLaneDims; ++k) {
    const int64_t d = lane + k * kWarp;
    if (d >= hs) continue;
    if (kMode == 0) {
      st(dqkv, qkv_at(b, me, t_len, c, 0, h, hs) + d, acc[k]);
    } else {
      st(dqkv, qkv_at(b, me, t_len, c, 1, h, hs) + d, acc[k]);
      st(dqkv, qkv_at(b, me, t_len, c, 2, h, hs) + d, acc2[k]);
    }
  }
}

// ---- token cross-entropy -----------------------------------------------------------------

// Block reduction of (max value, first index) and of a sum; thread 0's result is broadcast.
__device__ float block_sum(float v, float* sh) {
  v = warp_sum(v);
  if (threadIdx.x % kWarp == 0) sh[threadIdx.x / kWarp] = v;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < int(blockDim.x / kWarp); ++w) t += sh[w];
  __syncthreads();
  return t;
}

// A block per row. Every read of a row's logits happens before the barrier that precedes the
// gradient pass, so dlogits may alias the logits.
__global__ void token_xent_kernel(const float* logits, const int32_t* targets, int64_t vp,
                                  int64_t vocab, float g, float* dlogits, double* row_loss,
                                  int32_t* row_correct, int32_t* bad) {
  __shared__ float shv[kThreads / kWarp];
  __shared__ int64_t shi[kThreads / kWarp];
  __shared__ float sh[kThreads / kWarp];
  const int64_t r = blockIdx.x;
  const float* x = logits + r * vp;
  const int32_t tg = targets[r];
  float mx = -INFINITY;
  int64_t arg = vocab;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
    if (x[j] > mx) {  // per thread, the first index of its maximum
      mx = x[j];
      arg = j;
    }
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, mx, o);
    const int64_t oa = __shfl_xor_sync(0xffffffffu, arg, o);
    if (om > mx || (om == mx && oa < arg)) {
      mx = om;
      arg = oa;
    }
  }
  if (threadIdx.x % kWarp == 0) {
    shv[threadIdx.x / kWarp] = mx;
    shi[threadIdx.x / kWarp] = arg;
  }
  __syncthreads();
  mx = shv[0];
  arg = shi[0];
  for (int w = 1; w < int(blockDim.x / kWarp); ++w)
    if (shv[w] > mx || (shv[w] == mx && shi[w] < arg)) {
      mx = shv[w];
      arg = shi[w];
    }
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) s += expf(x[j] - mx);
  const float lse = mx + logf(block_sum(s, sh));
  const bool ok = tg >= 0 && tg < vocab;
  const float xt = ok ? x[tg] : 0.f;
  __syncthreads();  // every read of x is done: the gradient may overwrite it
  if (threadIdx.x == 0) {
    row_loss[r] = double(lse) - double(xt);
    row_correct[r] = arg == tg;
    if (!ok) atomicExch(bad, 1);
  }
  if (!dlogits || !ok) return;
  float* d = dlogits + r * vp;
  for (int64_t j = threadIdx.x; j < vp; j += blockDim.x)
    d[j] = j < vocab ? (expf(x[j] - lse) - (j == tg ? 1.f : 0.f)) * g : 0.f;
}

unsigned warp_blocks(int64_t rows) {
  const int64_t per = kThreads / kWarp;
  return unsigned((rows + per - 1) / per);
}

}  // namespace

void launch_embedding_fwd(const int32_t* tok, const void* wte, const void* wpe, DType wt, void* y,
                          DType yt, int64_t n, int64_t t_len, int64_t c, cudaStream_t s) {
  if (n == 0) return;
  dispatch(wt, [&](auto W) {
    using TW = typename decltype(W)::type;
    dispatch(yt, [&](auto Y) {
      using TY = typename decltype(Y)::type;
      embedding_fwd_kernel<<<blocks_for(n * c), kThreads, 0, s>>>(tok, static_cast<const TW*>(wte),
                                                                  static_cast<const TW*>(wpe),
                                                                  static_cast<TY*>(y), n, t_len, c);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_layernorm_fwd(const void* x, DType xt, const float* g, const float* b, float eps,
                          void* y, DType yt, float* mean, float* rstd, int64_t rows, int64_t c,
                          cudaStream_t s) {
  if (rows == 0) return;
  dispatch(xt, [&](auto X) {
    using TX = typename decltype(X)::type;
    dispatch(yt, [&](auto Y) {
      using TY = typename decltype(Y)::type;
      layernorm_fwd_kernel<<<warp_blocks(rows), kThreads, 0, s>>>(
          static_cast<const TX*>(x), g, b, eps, static_cast<TY*>(y), mean, rstd, rows, c);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_layernorm_bwd(const void* x, DType xt, const void* dy, void* dx, DType dt,
                          const float* g, const float* mean, const float* rstd, float* partial,
                          float* dg, float* db, int64_t rows, int64_t c, cudaStream_t s) {
  if (rows == 0) return;
  dispatch(xt, [&](auto X) {
    using TX = typename decltype(X)::type;
    dispatch(dt, [&](auto D) {
      using TD = typename decltype(D)::type;
      const auto* px = static_cast<const TX*>(x);
      const auto* pd = static_cast<const TD*>(dy);
      layernorm_dx_kernel<<<warp_blocks(rows), kThreads, 0, s>>>(px, pd, g, mean, rstd,
                                                                 static_cast<TD*>(dx), rows, c);
      CUDA_CHECK_LAUNCH();
      const dim3 grid(blocks_for(c), kLayerNormSlices);
      layernorm_dparam_kernel<<<grid, kThreads, 0, s>>>(px, pd, mean, rstd, rows, c, partial);
      CUDA_CHECK_LAUNCH();
      sum_slices_kernel<<<blocks_for(c), kThreads, 0, s>>>(partial, kLayerNormSlices, c, dg, db);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_attention_fwd(const void* qkv, void* out, DType t, float* lse, int64_t b, int64_t t_len,
                          int64_t heads, int64_t hs, cudaStream_t s) {
  const int64_t rows = b * heads * t_len;
  if (rows == 0) return;
  const float scale = 1.f / std::sqrt(float(hs));
  const size_t shmem = size_t(kThreads / kWarp) * size_t(hs) * sizeof(float);
  dispatch(t, [&](auto T) {
    using TT = typename decltype(T)::type;
    attention_fwd_kernel<<<warp_blocks(rows), kThreads, shmem, s>>>(
        static_cast<const TT*>(qkv), static_cast<TT*>(out), lse, b, t_len, heads, hs, scale);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_attention_bwd(const void* qkv, const void* out, const void* dout, DType t,
                          const float* lse, float* delta, void* dqkv, int64_t b, int64_t t_len,
                          int64_t heads, int64_t hs, cudaStream_t s) {
  const int64_t rows = b * heads * t_len;
  if (rows == 0) return;
  const float scale = 1.f / std::sqrt(float(hs));
  const size_t shmem = size_t(kThreads / kWarp) * 2 * size_t(hs) * sizeof(float);
  dispatch(t, [&](auto T) {
    using TT = typename decltype(T)::type;
    const auto* q = static_cast<const TT*>(qkv);
    const auto* d = static_cast<const TT*>(dout);
    attention_delta_kernel<<<warp_blocks(rows), kThreads, 0, s>>>(static_cast<const TT*>(out), d,
                                                                  delta, b, t_len, heads, hs);
    CUDA_CHECK_LAUNCH();
    attention_bwd_kernel<TT, 0><<<warp_blocks(rows), kThreads, shmem, s>>>(
        q, d, lse, delta, static_cast<TT*>(dqkv), b, t_len, heads, hs, scale);
    CUDA_CHECK_LAUNCH();
    attention_bwd_kernel<TT, 1><<<warp_blocks(rows), kThreads, shmem, s>>>(
        q, d, lse, delta, static_cast<TT*>(dqkv), b, t_len, heads, hs, scale);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_token_xent(const float* logits, const int32_t* targets, int64_t rows, int64_t vp,
                       int64_t vocab, float g, float* dlogits, double* row_loss,
                       int32_t* row_correct, int32_t* bad, cudaStream_t s) {
  if (rows == 0) return;
  token_xent_kernel<<<unsigned(rows), kThreads, 0, s>>>(logits, targets, vp, vocab, g, dlogits,
                                                        row_loss, row_correct, bad);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ringtrain::kernels::cuda
