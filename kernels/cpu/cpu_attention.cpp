// CPU causal multi-head self-attention in vector loops (cpu_attention_gemm.cpp runs it as
// oneDNN tile GEMMs where CpuOptions::attention says: bf16 on AMX), blocked as
// FlashAttention: per (batch, head), query tiles of kTile rows against key tiles of kTile columns
// up to the diagonal, an online softmax (running maximum and sum per query), so at most one tile
// row of scores exists at a time and never the T x T matrix. Forward saves each query's
// log-sum-exp; backward recomputes the probabilities from it. One (batch, head) per thread: each
// output element is written by one thread in a fixed order (deterministic for any thread count).
// The head's q, k, v are widened to fp32 once; k and v are also kept transposed so that a query's
// scores over a key tile are a run of contiguous multiply-adds (vectorised over the tile's keys).
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

constexpr int64_t kTile = 64;   // queries per tile and keys per tile
constexpr int64_t kChunk = 16;  // head dimensions per register (one AVX-512 vector)

// One head's working set in fp32: q, k, v [T, hs]; kt, vt [hs, Tp] (transposed, Tp = T
// rounded up to the tile, zero-padded) and the output / gradients [T, hs].
struct HeadBuffers {
  int64_t tp = 0;
  std::vector<float> q, k, v, kt, vt, o, d_o, dq, dk, dv;
  void resize(int64_t t, int64_t hs) {
    tp = (t + kTile - 1) / kTile * kTile;
    // + kChunk: the last row's final chunk may read past hs (its lanes are not used)
    for (auto* b : {&q, &k, &v, &o, &d_o, &dq, &dk, &dv}) b->assign(size_t(t * hs + kChunk), 0.f);
    kt.assign(size_t(hs * tp), 0.f);
    vt.assign(size_t(hs * tp), 0.f);
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

void transpose(const float* a, int64_t t, int64_t hs, int64_t tp, float* at) {
  for (int64_t i = 0; i < t; ++i)
    for (int64_t d = 0; d < hs; ++d) at[d * tp + i] = a[i * hs + d];
}

constexpr int kRows = 4;  // query rows scored together: 4 x 64 accumulators, one pass over k

// acc_g[d] += sum_j w_g[j] * m_j[d] over j < n for kRows rows g (m_j = rows j0.. of m, [T, hs]):
// 16 columns at a time in registers, each m row loaded once per chunk.
RT_INLINE void accumulate_rows(const float (*w)[kTile], const float* m, int64_t hs, int64_t n,
                               float* const* acc, int64_t nr) {
  for (int64_t d0 = 0; d0 < hs; d0 += kChunk) {
    float a0[kChunk] = {}, a1[kChunk] = {}, a2[kChunk] = {}, a3[kChunk] = {};
    for (int64_t j = 0; j < n; ++j) {
      const float* mj = m + j * hs + d0;
      const float w0 = w[0][j], w1 = w[1][j], w2 = w[2][j], w3 = w[3][j];
#pragma omp simd
      for (int64_t dd = 0; dd < kChunk; ++dd) {
        a0[dd] += w0 * mj[dd];
        a1[dd] += w1 * mj[dd];
        a2[dd] += w2 * mj[dd];
        a3[dd] += w3 * mj[dd];
      }
    }
    const int64_t cw = std::min<int64_t>(kChunk, hs - d0);
    float* const a[kRows] = {a0, a1, a2, a3};
    for (int64_t g = 0; g < nr; ++g)
      for (int64_t dd = 0; dd < cw; ++dd) acc[g][d0 + dd] += a[g][dd];
  }
}

// s[r][0, kTile) = scale * (a_r . columns j0.. of mt) for kRows rows a_r; mt [hs, tp].
RT_INLINE void scores_block(const float* const* a, const float* mt, int64_t tp, int64_t hs,
                            int64_t j0, float scale, float (*s)[kTile]) {
  float s0[kTile] = {}, s1[kTile] = {}, s2[kTile] = {}, s3[kTile] = {};
  for (int64_t d = 0; d < hs; ++d) {
    const float* m = mt + d * tp + j0;
    const float a0 = a[0][d], a1 = a[1][d], a2 = a[2][d], a3 = a[3][d];
#pragma omp simd
    for (int64_t j = 0; j < kTile; ++j) {
      s0[j] += a0 * m[j];
      s1[j] += a1 * m[j];
      s2[j] += a2 * m[j];
      s3[j] += a3 * m[j];
    }
  }
#pragma omp simd
  for (int64_t j = 0; j < kTile; ++j) {
    s[0][j] = s0[j] * scale;
    s[1][j] = s1[j] * scale;
    s[2][j] = s2[j] * scale;
    s[3][j] = s3[j] * scale;
  }
}

// Forward of one head: o [T, hs] and lse [T] from q, k, v (kt = k transposed).
RT_INLINE void head_forward_body(HeadBuffers& hb, int64_t t, int64_t hs, float scale, float* lse) {
  float s[kRows][kTile];
  for (int64_t i0 = 0; i0 < t; i0 += kTile) {
    const int64_t rows = std::min(kTile, t - i0);
    float m[kTile], l[kTile];
    for (int64_t r = 0; r < rows; ++r) {
      m[r] = -std::numeric_limits<float>::infinity();
      l[r] = 0.f;
      std::fill(hb.o.begin() + (i0 + r) * hs, hb.o.begin() + (i0 + r + 1) * hs, 0.f);
    }
    for (int64_t j0 = 0; j0 < i0 + rows; j0 += kTile) {
      for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
        const int64_t nr = std::min<int64_t>(kRows, rows - r0);
        const float* a[kRows];
        for (int g = 0; g < kRows; ++g)
          a[g] = hb.q.data() + (i0 + r0 + std::min<int64_t>(g, nr - 1)) * hs;
        scores_block(a, hb.kt.data(), hb.tp, hs, j0, scale, s);
        int64_t nmax = 0;
        for (int64_t g = 0; g < kRows; ++g) {
          const int64_t i = i0 + r0 + g;
          // keys j0 .. i of this tile; the rest (and rows past the tile) are masked out
          const int64_t n = g < nr ? std::clamp<int64_t>(i - j0 + 1, 0, kTile) : 0;
          nmax = std::max(nmax, n);
          if (n == 0) {
            std::fill(s[g], s[g] + kTile, 0.f);
            continue;
          }
          const int64_t r = r0 + g;
          float mx = m[r];
          for (int64_t j = 0; j < n; ++j) mx = std::max(mx, s[g][j]);
          const float corr = exp_fast(m[r] - mx);
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < kTile; ++j) {
            const float p = j < n ? exp_fast(s[g][j] - mx) : 0.f;
            s[g][j] = p;
            sum += p;
          }
          l[r] = l[r] * corr + sum;
          m[r] = mx;
          float* o = hb.o.data() + i * hs;
#pragma omp simd
          for (int64_t d = 0; d < hs; ++d) o[d] *= corr;
        }
        // o_r += sum_j p_rj v_j for the block's rows.
        float* orow[kRows];
        for (int g = 0; g < kRows; ++g)
          orow[g] = hb.o.data() + (i0 + r0 + std::min<int64_t>(g, nr - 1)) * hs;
        accumulate_rows(s, hb.v.data() + j0 * hs, hs, nmax, orow, nr);
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
  float s[kRows][kTile], dp[kRows][kTile];
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
      for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
        const int64_t nr = std::min<int64_t>(kRows, rows - r0);
        const float *qa[kRows], *ga[kRows];
        for (int g = 0; g < kRows; ++g) {
          const int64_t i = i0 + r0 + std::min<int64_t>(g, nr - 1);
          qa[g] = hb.q.data() + i * hs;
          ga[g] = hb.d_o.data() + i * hs;
        }
        scores_block(qa, hb.kt.data(), hb.tp, hs, j0, scale, s);
        scores_block(ga, hb.vt.data(), hb.tp, hs, j0, 1.f, dp);
        int64_t nmax = 0;
        for (int64_t g = 0; g < kRows; ++g) {
          const int64_t i = i0 + r0 + g;
          const int64_t n = g < nr ? std::clamp<int64_t>(i - j0 + 1, 0, kTile) : 0;
          nmax = std::max(nmax, n);
          const float li = g < nr ? lse[i] : 0.f, de = g < nr ? delta[r0 + g] : 0.f;
#pragma omp simd
          for (int64_t j = 0; j < kTile; ++j) {
            const float p = j < n ? exp_fast(s[g][j] - li) : 0.f;
            s[g][j] = p;                             // probability
            dp[g][j] = p * (dp[g][j] - de) * scale;  // gradient of the unscaled dot product
          }
        }
        // dq_r += sum_j ds_rj k_j (in registers over j); dk_j += sum_r ds_rj q_r and
        // dv_j += sum_r p_rj dO_r (each dk/dv row read and written once per block).
        float* dqrow[kRows];
        for (int g = 0; g < kRows; ++g)
          dqrow[g] = hb.dq.data() + (i0 + r0 + std::min<int64_t>(g, nr - 1)) * hs;
        accumulate_rows(dp, hb.k.data() + j0 * hs, hs, nmax, dqrow, nr);
        for (int64_t j = 0; j < nmax; ++j) {
          float* dk = hb.dk.data() + (j0 + j) * hs;
          float* dv = hb.dv.data() + (j0 + j) * hs;
          const float d0 = dp[0][j], d1 = dp[1][j], d2 = dp[2][j], d3 = dp[3][j];
          const float p0 = s[0][j], p1 = s[1][j], p2 = s[2][j], p3 = s[3][j];
#pragma omp simd
          for (int64_t d = 0; d < hs; ++d) {
            dk[d] += d0 * qa[0][d] + d1 * qa[1][d] + d2 * qa[2][d] + d3 * qa[3][d];
            dv[d] += p0 * ga[0][d] + p1 * ga[1][d] + p2 * ga[2][d] + p3 * ga[3][d];
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

// Runs fn(hb, u, base, col) for every (sample, head) unit u over `threads` threads, with
// the unit's q, k and v gathered into hb and k transposed (base: the sample's first row;
// col: the head's first column).
template <typename Fn>
void for_each_head(const AttentionDims& d, const Tensor& qkv, int threads, Fn&& fn) {
  const int64_t units = d.b * d.heads;
#pragma omp parallel num_threads(threads) if (threads > 1 && units > 1)
  {
    HeadBuffers hb;
    hb.resize(d.t, d.hs);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t base = u / d.heads * d.t, col = u % d.heads * d.hs;
      gather_head(qkv, base, d.t, 3 * d.c, col, d.hs, hb.q.data());
      gather_head(qkv, base, d.t, 3 * d.c, d.c + col, d.hs, hb.k.data());
      gather_head(qkv, base, d.t, 3 * d.c, 2 * d.c + col, d.hs, hb.v.data());
      transpose(hb.k.data(), d.t, d.hs, hb.tp, hb.kt.data());
      fn(hb, u, base, col);
    }
  }
}

}  // namespace

void CpuBackend::attention_forward(int64_t heads, const Tensor& qkv, const Tensor& out,
                                   const Tensor& lse) {
  const AttentionDims d = attention_dims(heads, qkv, out, lse);
  if (attention_as_gemms(qkv, qkv)) return attention_forward_gemm(d, qkv, out, lse);
  const float scale = 1.f / std::sqrt(float(d.hs));
  const bool avx512 = use_avx512();
  for_each_head(d, qkv, threads_, [&](HeadBuffers& hb, int64_t u, int64_t base, int64_t col) {
    float* l = lse.as<float>() + u * d.t;
    if (avx512)
      head_forward_avx512(hb, d.t, d.hs, scale, l);
    else
      head_forward_base(hb, d.t, d.hs, scale, l);
    scatter_head(hb.o.data(), d.t, d.hs, out, base, d.c, col);
  });
}

void CpuBackend::attention_backward(int64_t heads, const Tensor& qkv, const Tensor& out,
                                    const Tensor& dout, const Tensor& lse, const Tensor& dqkv) {
  const AttentionDims d = attention_dims(heads, qkv, out, lse);
  RT_CHECK(dout.numel() == out.numel() && dqkv.numel() == qkv.numel(), "attention gradients ",
           shape_str(dout.shape), " and ", shape_str(dqkv.shape), " do not match ",
           shape_str(out.shape), " and ", shape_str(qkv.shape));
  if (attention_as_gemms(qkv, dout)) return attention_backward_gemm(d, qkv, out, dout, lse, dqkv);
  const float scale = 1.f / std::sqrt(float(d.hs));
  const bool avx512 = use_avx512();
  for_each_head(d, qkv, threads_, [&](HeadBuffers& hb, int64_t u, int64_t base, int64_t col) {
    gather_head(out, base, d.t, d.c, col, d.hs, hb.o.data());
    gather_head(dout, base, d.t, d.c, col, d.hs, hb.d_o.data());
    transpose(hb.v.data(), d.t, d.hs, hb.tp, hb.vt.data());
    const float* l = lse.as<float>() + u * d.t;
    if (avx512)
      head_backward_avx512(hb, d.t, d.hs, scale, l);
    else
      head_backward_base(hb, d.t, d.hs, scale, l);
    scatter_head(hb.dq.data(), d.t, d.hs, dqkv, base, 3 * d.c, col);
    scatter_head(hb.dk.data(), d.t, d.hs, dqkv, base, 3 * d.c, d.c + col);
    scatter_head(hb.dv.data(), d.t, d.hs, dqkv, base, 3 * d.c, 2 * d.c + col);
  });
}

}  // namespace ringtrain::kernels::cpu
