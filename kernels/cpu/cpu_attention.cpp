// CPU causal multi-head self-attention, blocked as FlashAttention: per (batch, head), query
// tiles of kTile rows against key tiles of kTile columns up to the diagonal, an online
// softmax (running maximum and sum per query), so at most one tile row of scores exists at a
// time and never the T x T matrix. Forward saves each query's log-sum-exp; backward recomputes
// the probabilities from it. One (batch, head) per thread: each output element is written by
// one thread in a fixed order (deterministic for any thread count). The head's q, k, v are
// widened to fp32 once; k and v are also kept transposed so that a query's scores over a key
// tile are a run of contiguous multiply-adds (vectorised over the tile's keys).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace ringtrain::kernels::cpu {

namespace {

constexpr int64_t kTile = 64;  // queries per tile and keys per tile

// One head's working set in fp32: q, k, v [T, hs]; kt, vt [hs, T]; plus per-pass buffers.
struct HeadBuffers {
  std::vector<float> q, k, v, kt, vt, o, d_o, dq, dk, dv, s, p;
  void resize(int64_t t, int64_t hs) {
    for (auto* b : {&q, &k, &v, &kt, &vt, &o, &d_o, &dq, &dk, &dv}) b->assign(size_t(t * hs), 0.f);
    s.assign(size_t(kTile), 0.f);
    p.assign(size_t(kTile), 0.f);
  }
};

// rows [t] of `width` columns starting at column `col` of a [T, stride] matrix -> dst [T, hs].
void gather_head(const Tensor& src, int64_t base, int64_t t, int64_t stride, int64_t col,
                 int64_t hs, float* dst) {
  const size_t sz = dtype_size(src.dtype);
  for (int64_t i = 0; i < t; ++i) {
    const char* row =
        static_cast<const char*>(src.data) + ((base + i) * stride + col) * int64_t(sz);
    to_f32(row, src.dtype, dst + i * hs, hs, 1);
  }
}

void scatter_head(const float* src, int64_t t, int64_t hs, const Tensor& dst, int64_t base,
                  int64_t stride, int64_t col) {
  const size_t sz = dtype_size(dst.dtype);
  for (int64_t i = 0; i < t; ++i) {
    char* row = static_cast<char*>(dst.data) + ((base + i) * stride + col) * int64_t(sz);
    from_f32(src + i * hs, row, dst.dtype, hs, 1);
  }
}

void transpose(const float* a, int64_t t, int64_t hs, float* at) {
  for (int64_t i = 0; i < t; ++i)
    for (int64_t d = 0; d < hs; ++d) at[d * t + i] = a[i * hs + d];
}

// s[0, n) = scale * (q . columns j0.. of mt), mt [hs, T] (k or v transposed).
RT_INLINE void row_dots(const float* q, const float* mt, int64_t t, int64_t hs, int64_t j0,
                        int64_t n, float scale, float* s) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) s[j] = 0.f;
  for (int64_t d = 0; d < hs; ++d) {
    const float qd = q[d];
    const float* m = mt + d * t + j0;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) s[j] += qd * m[j];
  }
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) s[j] *= scale;
}

// Forward of one head: o [T, hs] and lse [T] from q, k, v (kt = k transposed).
RT_INLINE void head_forward_body(HeadBuffers& hb, int64_t t, int64_t hs, float scale, float* lse) {
  float* s = hb.s.data();
  for (int64_t i0 = 0; i0 < t; i0 += kTile) {
    const int64_t rows = std::min(kTile, t - i0);
    float m[kTile], l[kTile];
    for (int64_t r = 0; r < rows; ++r) {
      m[r] = -std::numeric_limits<float>::infinity();
      l[r] = 0.f;
      std::fill(hb.o.begin() + (i0 + r) * hs, hb.o.begin() + (i0 + r + 1) * hs, 0.f);
    }
    for (int64_t j0 = 0; j0 < i0 + rows; j0 += kTile) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        const int64_t n = std::min(kTile, i - j0 + 1);  // keys j0 .. i of this tile
        if (n <= 0) continue;
        row_dots(hb.q.data() + i * hs, hb.kt.data(), t, hs, j0, n, scale, s);
        float mx = m[r];
        for (int64_t j = 0; j < n; ++j) mx = std::max(mx, s[j]);
        const float corr = exp_fast(m[r] - mx);
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < n; ++j) {
          s[j] = exp_fast(s[j] - mx);
          sum += s[j];
        }
        l[r] = l[r] * corr + sum;
        m[r] = mx;
        float* o = hb.o.data() + i * hs;
#pragma omp simd
        for (int64_t d = 0; d < hs; ++d) o[d] *= corr;
        for (int64_t j = 0; j < n; ++j) {
          const float pj = s[j];
          const float* v = hb.v.data() + (j0 + j) * hs;
#pragma omp simd
          for (int64_t d = 0; d < hs; ++d) o[d] += pj * v[d];
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* o = hb.o.data() + (i0 + r) * hs;
      const float inv = 1.f / l[r];
#pragma omp simd
      for (int64_t d = 0; d < hs; ++d) o[d] *= inv;
      lse[i0 + r] = m[r] + std::log(l[r]);
    }
  }
}

// Backward of one head: dq, dk, dv [T, hs] from q, k, v, o, d_o and lse (kt, vt transposed).
RT_INLINE void head_backward_body(HeadBuffers& hb, int64_t t, int64_t hs, float scale,
                                  const float* lse) {
  float* s = hb.s.data();
  float* dp = hb.p.data();
  std::fill(hb.dq.begin(), hb.dq.end(), 0.f);
  std::fill(hb.dk.begin(), hb.dk.end(), 0.f);
  std::fill(hb.dv.begin(), hb.dv.end(), 0.f);
  for (int64_t i0 = 0; i0 < t; i0 += kTile) {
    const int64_t rows = std::min(kTile, t - i0);
    float delta[kTile];  // rowsum(dO * O): the softmax Jacobian's diagonal term
    for (int64_t r = 0; r < rows; ++r) {
      const float* o = hb.o.data() + (i0 + r) * hs;
      const float* g = hb.d_o.data() + (i0 + r) * hs;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t d = 0; d < hs; ++d) acc += o[d] * g[d];
      delta[r] = acc;
    }
    for (int64_t j0 = 0; j0 < i0 + rows; j0 += kTile) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        const int64_t n = std::min(kTile, i - j0 + 1);
        if (n <= 0) continue;
        const float* q = hb.q.data() + i * hs;
        const float* g = hb.d_o.data() + i * hs;
        row_dots(q, hb.kt.data(), t, hs, j0, n, scale, s);
        row_dots(g, hb.vt.data(), t, hs, j0, n, 1.f, dp);
        const float li = lse[i];
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          const float p = exp_fast(s[j] - li);
          s[j] = p;                                // probability
          dp[j] = p * (dp[j] - delta[r]) * scale;  // gradient of the unscaled dot product
        }
        float* dq = hb.dq.data() + i * hs;
        for (int64_t j = 0; j < n; ++j) {
          const float pj = s[j], dsj = dp[j];
          const float* k = hb.k.data() + (j0 + j) * hs;
          float* dk = hb.dk.data() + (j0 + j) * hs;
          float* dv = hb.dv.data() + (j0 + j) * hs;
#pragma omp simd
          for (int64_t d = 0; d < hs; ++d) {
            dq[d] += dsj * k[d];
            dk[d] += dsj * q[d];
            dv[d] += pj * g[d];
          }
        }
      }
    }
  }
}

void head_forward_base(HeadBuffers& hb, int64_t t, int64_t hs, float scale, float* lse) {
  head_forward_body(hb, t, hs, scale, lse);
}
RT_AVX512_TARGET void head_forward_avx512(HeadBuffers& hb, int64_t t, int64_t hs, float scale,
                                          float* lse) {
  head_forward_body(hb, t, hs, scale, lse);
}
void head_backward_base(HeadBuffers& hb, int64_t t, int64_t hs, float scale, const float* lse) {
  head_backward_body(hb, t, hs, scale, lse);
}
RT_AVX512_TARGET void head_backward_avx512(HeadBuffers& hb, int64_t t, int64_t hs, float scale,
                                           const float* lse) {
  head_backward_body(hb, t, hs, scale, lse);
}

}  // namespace

void CpuBackend::attention_forward(int64_t heads, const Tensor& qkv, const Tensor& out,
                                   const Tensor& lse) {
  const AttentionDims d = attention_dims(heads, qkv, out, lse);
  const float scale = 1.f / std::sqrt(float(d.hs));
  const bool avx512 = use_avx512();
  const int64_t units = d.b * d.heads;
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && units > 1)
  {
    HeadBuffers hb;
    hb.resize(d.t, d.hs);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t b = u / d.heads, h = u % d.heads;
      const int64_t base = b * d.t, col = h * d.hs;
      gather_head(qkv, base, d.t, 3 * d.c, col, d.hs, hb.q.data());
      gather_head(qkv, base, d.t, 3 * d.c, d.c + col, d.hs, hb.k.data());
      gather_head(qkv, base, d.t, 3 * d.c, 2 * d.c + col, d.hs, hb.v.data());
      transpose(hb.k.data(), d.t, d.hs, hb.kt.data());
      float* l = lse.as<float>() + u * d.t;
      if (avx512)
        head_forward_avx512(hb, d.t, d.hs, scale, l);
      else
        head_forward_base(hb, d.t, d.hs, scale, l);
      scatter_head(hb.o.data(), d.t, d.hs, out, base, d.c, col);
    }
  }
}

void CpuBackend::attention_backward(int64_t heads, const Tensor& qkv, const Tensor& out,
                                    const Tensor& dout, const Tensor& lse, const Tensor& dqkv) {
  const AttentionDims d = attention_dims(heads, qkv, out, lse);
  RT_CHECK(dout.numel() == out.numel() && dqkv.numel() == qkv.numel(), "attention gradients ",
           shape_str(dout.shape), " and ", shape_str(dqkv.shape), " do not match ",
           shape_str(out.shape), " and ", shape_str(qkv.shape));
  const float scale = 1.f / std::sqrt(float(d.hs));
  const bool avx512 = use_avx512();
  const int64_t units = d.b * d.heads;
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && units > 1)
  {
    HeadBuffers hb;
    hb.resize(d.t, d.hs);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t b = u / d.heads, h = u % d.heads;
      const int64_t base = b * d.t, col = h * d.hs;
      gather_head(qkv, base, d.t, 3 * d.c, col, d.hs, hb.q.data());
      gather_head(qkv, base, d.t, 3 * d.c, d.c + col, d.hs, hb.k.data());
      gather_head(qkv, base, d.t, 3 * d.c, 2 * d.c + col, d.hs, hb.v.data());
      gather_head(out, base, d.t, d.c, col, d.hs, hb.o.data());
      gather_head(dout, base, d.t, d.c, col, d.hs, hb.d_o.data());
      transpose(hb.k.data(), d.t, d.hs, hb.kt.data());
      transpose(hb.v.data(), d.t, d.hs, hb.vt.data());
      const float* l = lse.as<float>() + u * d.t;
      if (avx512)
        head_backward_avx512(hb, d.t, d.hs, scale, l);
      else
        head_backward_base(hb, d.t, d.hs, scale, l);
      scatter_head(hb.dq.data(), d.t, d.hs, dqkv, base, 3 * d.c, col);
      scatter_head(hb.dk.data(), d.t, d.hs, dqkv, base, 3 * d.c, d.c + col);
      scatter_head(hb.dv.data(), d.t, d.hs, dqkv, base, 3 * d.c, 2 * d.c + col);
    }
  }
}

}  // namespace ringtrain::kernels::cpu
