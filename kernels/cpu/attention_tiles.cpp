// The attention tile kernels (attention_tiles.hpp) for baseline x86-64 and AVX-512.
// Hand-written rather than oneDNN calls: a tile product is at most 64 x 64 x 64, and oneDNN
// 2.6's per-call cost (primitive lookup, argument set-up) exceeds such a tile's arithmetic, so
// fp32 attention through it ran no faster than vector loops on the mid GPT and slower on
// gpt-tiny (docs/benchmarks.md, gpt_bench). The AVX-512 product keeps a block of rows x up to
// 4 vectors of c in registers (24 accumulators), loads each row of B once per block and
// broadcasts A's elements, so it is bound by the FMAs rather than by loads.
#include "kernels/cpu/attention_tiles.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/vec512.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace ringtrain::kernels::cpu {

namespace {

constexpr int64_t kLanes = 16;  // floats per AVX-512 vector
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round_lanes(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// The columns [0, ncols) and the k range [kb, ke) that rows [r0, r0 + mr) of a product need
// (columns counted from c0, the 64-column chunk being computed).
struct BlockRange {
  int64_t ncols, kb, ke;
};
RT_INLINE BlockRange block_range(const TileProduct& p, int64_t c0, int64_t nc, int64_t r0,
                                 int64_t mr) {
  BlockRange br{nc, 0, p.k};
  if (p.causal == TileCausal::cols_to_row)
    br.ncols = std::clamp<int64_t>(r0 + mr - c0, 0, nc);
  else if (p.causal == TileCausal::k_to_row)
    br.ke = std::min(p.k, r0 + mr);
  else if (p.causal == TileCausal::k_from_row)
    br.kb = std::min(p.k, r0);
  return br;
}

// ---- row passes compiled for both ISAs -------------------------------------------------------

RT_INLINE void scale_rows_body(float* x, int64_t ld, int64_t rows, int64_t hs, const float* f) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * ld;
    const float fr = f[r];
#pragma omp simd
    for (int64_t d = 0; d < hs; ++d) xr[d] *= fr;
  }
}

RT_INLINE void finish_rows_body(const float* acc, int64_t lda, int64_t rows, int64_t hs,
                                const float* m, const float* l, float* out, int64_t ldo,
                                float* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = acc + r * lda;
    float* o = out + r * ldo;
    const float inv = 1.f / l[r];
#pragma omp simd
    for (int64_t d = 0; d < hs; ++d) o[d] = ar[d] * inv;
    lse[r] = m[r] + std::log(l[r]);
  }
}

// ---- baseline x86-64 ----------------------------------------------------------------------

// The row loops run to a multiple of 16 columns with the masked ones selected away, so they
// vectorise without a scalar tail.
void softmax_forward_base(float* s, int64_t ld, int64_t rows, int64_t n, bool diagonal, float* m,
                          float* l, float* corr) {
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * ld;
    const int64_t nr = diagonal ? r + 1 : n, nv = round_lanes(nr);  // nv <= ld (64)
    float mx = m[r];
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < nv; ++j) {
      const float v = j < nr ? sr[j] : kNegInf;
      mx = v > mx ? v : mx;
    }
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < nv; ++j) {
      const float p = j < nr ? exp_fast(sr[j] - mx) : 0.f;
      sr[j] = p;
      sum += p;
    }
    for (int64_t j = nv; j < n; ++j) sr[j] = 0.f;
    corr[r] = exp_fast(m[r] - mx);
    l[r] = l[r] * corr[r] + sum;
    m[r] = mx;
  }
}

void softmax_backward_base(float* s, float* dp, int64_t ld, int64_t rows, int64_t n, bool diagonal,
                           const float* lse, const float* delta, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float *sr = s + r * ld, *dr = dp + r * ld;
    const int64_t nr = diagonal ? r + 1 : n, nv = round_lanes(nr);
    const float li = lse[r], de = delta[r];
#pragma omp simd
    for (int64_t j = 0; j < nv; ++j) {
      const bool in = j < nr;
      const float p = in ? exp_fast(sr[j] - li) : 0.f;
      sr[j] = p;
      dr[j] = in ? p * (dr[j] - de) * scale : 0.f;
    }
    for (int64_t j = nv; j < n; ++j) sr[j] = dr[j] = 0.f;
  }
}

void row_dots_base(const float* x, int64_t ldx, const float* y, int64_t ldy, int64_t rows,
                   int64_t hs, float* dot) {
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * ldx, *yr = y + r * ldy;
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int64_t d = 0; d < hs; ++d) acc += xr[d] * yr[d];
    dot[r] = acc;
  }
}

// One row at a time, its (up to 64) results in an array the compiler vectorises over.
void product_base(const TileProduct& p) {
  float acc[kAttnTile];
  for (int64_t c0 = 0; c0 < p.n; c0 += kAttnTile) {
    const int64_t nc = std::min(kAttnTile, p.n - c0);
    for (int64_t r = 0; r < p.m; ++r) {
      const BlockRange br = block_range(p, c0, nc, r, 1);
      const int64_t w = br.ncols;
      std::fill(acc, acc + w, 0.f);
      for (int64_t k = br.kb; k < br.ke; ++k) {
        const float a = p.a[r * p.a_rs + k * p.a_cs];
        const float* bk = p.b + k * p.ldb + c0;
        for (int64_t j = 0; j < w; ++j) acc[j] += a * bk[j];
      }
      float* c = p.c + r * p.ldc + c0;
      for (int64_t j = 0; j < w; ++j) c[j] = p.alpha * acc[j] + (p.accumulate ? c[j] : 0.f);
    }
  }
}

void transpose_base(const float* src, int64_t lds, int64_t t, int64_t hs, float* dst, int64_t ldt) {
  for (int64_t i = 0; i < t; ++i)
    for (int64_t d = 0; d < hs; ++d) dst[d * ldt + i] = src[i * lds + d];
}

void scale_rows_base(float* x, int64_t ld, int64_t rows, int64_t hs, const float* f) {
  scale_rows_body(x, ld, rows, hs, f);
}
void finish_rows_base(const float* acc, int64_t lda, int64_t rows, int64_t hs, const float* m,
                      const float* l, float* out, int64_t ldo, float* lse) {
  finish_rows_body(acc, lda, rows, hs, m, l, out, ldo, lse);
}

// ---- AVX-512 ------------------------------------------------------------------------------

// GCC 12's AVX-512 headers build shuffles, masked moves and reductions on
// _mm512_undefined_ps(), a self-initialised variable that -Wmaybe-uninitialized reports
// wherever they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Rows per register block for nv vectors of c per row: 24 accumulators (of 32 registers),
// the rest for B's row and a broadcast. Non-increasing in nv.
constexpr int rows_for(int nv) { return nv <= 2 ? 12 : nv == 3 ? 8 : 6; }

// MR rows x NV vectors of c (the last vector's columns masked by `last`) over kn steps of k.
template <int MR, int NV>
RT_AVX512_TARGET RT_INLINE void block_avx512(int64_t kn, const float* a, int64_t a_rs, int64_t a_cs,
                                             const float* b, int64_t ldb, __mmask16 last, float* c,
                                             int64_t ldc, float alpha, bool accumulate) {
  __m512 x[MR][NV];
#pragma GCC unroll 24
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) x[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kn; ++k) {
    const float* bk = b + k * ldb;
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = v + 1 < NV ? _mm512_loadu_ps(bk + kLanes * v)
                         : _mm512_maskz_loadu_ps(last, bk + kLanes * v);
    const float* ak = a + k * a_cs;
#pragma GCC unroll 24
    for (int r = 0; r < MR; ++r) {
      const __m512 ar = _mm512_set1_ps(ak[r * a_rs]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) x[r][v] = _mm512_fmadd_ps(ar, bv[v], x[r][v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 24
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* cr = c + r * ldc + kLanes * v;
      const __mmask16 mask = v + 1 < NV ? __mmask16(0xffff) : last;
      __m512 y = _mm512_mul_ps(x[r][v], va);
      if (accumulate) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mask, cr));
      _mm512_mask_storeu_ps(cr, mask, y);
    }
}

// block_avx512<mr, NV> for a run-time mr <= MR.
template <int NV, int MR>
RT_AVX512_TARGET RT_INLINE void block_rows_avx512(int64_t mr, int64_t kn, const float* a,
                                                  int64_t a_rs, int64_t a_cs, const float* b,
                                                  int64_t ldb, __mmask16 last, float* c,
                                                  int64_t ldc, float alpha, bool accumulate) {
  if constexpr (MR > 1) {
    if (mr < MR)
      return block_rows_avx512<NV, MR - 1>(mr, kn, a, a_rs, a_cs, b, ldb, last, c, ldc, alpha,
                                           accumulate);
  }
  block_avx512<MR, NV>(kn, a, a_rs, a_cs, b, ldb, last, c, ldc, alpha, accumulate);
}

RT_AVX512_TARGET void product_avx512(const TileProduct& p) {
  for (int64_t c0 = 0; c0 < p.n; c0 += kAttnTile) {
    const int64_t nc = std::min(kAttnTile, p.n - c0);
    const int64_t rb = rows_for(int((nc + kLanes - 1) / kLanes));
    for (int64_t r0 = 0; r0 < p.m; r0 += rb) {
      const int64_t mr = std::min(rb, p.m - r0);
      const BlockRange br = block_range(p, c0, nc, r0, mr);
      if (br.ncols <= 0) continue;
      const int nv = int((br.ncols + kLanes - 1) / kLanes);  // mr <= rows_for(nv)
      const __mmask16 last = __mmask16(0xffffu >> (kLanes * nv - br.ncols));
      const int64_t kn = br.ke - br.kb;
      const float* a = p.a + r0 * p.a_rs + br.kb * p.a_cs;
      const float* b = p.b + br.kb * p.ldb + c0;
      float* c = p.c + r0 * p.ldc + c0;
      switch (nv) {
        case 1:
          block_rows_avx512<1, rows_for(1)>(mr, kn, a, p.a_rs, p.a_cs, b, p.ldb, last, c, p.ldc,
                                            p.alpha, p.accumulate);
          break;
        case 2:
          block_rows_avx512<2, rows_for(2)>(mr, kn, a, p.a_rs, p.a_cs, b, p.ldb, last, c, p.ldc,
                                            p.alpha, p.accumulate);
          break;
        case 3:
          block_rows_avx512<3, rows_for(3)>(mr, kn, a, p.a_rs, p.a_cs, b, p.ldb, last, c, p.ldc,
                                            p.alpha, p.accumulate);
          break;
        default:
          block_rows_avx512<4, rows_for(4)>(mr, kn, a, p.a_rs, p.a_cs, b, p.ldb, last, c, p.ldc,
                                            p.alpha, p.accumulate);
      }
    }
  }
}

// In-register transpose of a 16 x 16 block: rows r[i] become columns.
RT_AVX512_TARGET RT_INLINE void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {  // pairs of rows interleaved within 128-bit lanes
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  __m512 u[16];  // u[4g + c], lane L: rows 4g .. 4g+3 of column 4L + c
  for (int g = 0; g < 4; ++g) {
    const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * g + 2]), d = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int c = 0; c < 4; ++c) {  // gather lane L of u[c], u[4 + c], u[8 + c], u[12 + c]
    const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
    const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
    const __m512 w0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    const __m512 w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
    r[c] = _mm512_shuffle_f32x4(v0, w0, 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(v1, w1, 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(v0, w0, 0xdd);
    r[12 + c] = _mm512_shuffle_f32x4(v1, w1, 0xdd);
  }
}

RT_AVX512_TARGET void transpose_avx512(const float* src, int64_t lds, int64_t t, int64_t hs,
                                       float* dst, int64_t ldt) {
  for (int64_t i0 = 0; i0 < t; i0 += kLanes) {
    const int64_t ni = std::min(kLanes, t - i0);
    const __mmask16 im = __mmask16(0xffffu >> (kLanes - ni));
    for (int64_t d0 = 0; d0 < hs; d0 += kLanes) {
      const int64_t nd = std::min(kLanes, hs - d0);
      const __mmask16 dm = __mmask16(0xffffu >> (kLanes - nd));
      __m512 r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = i < ni ? _mm512_maskz_loadu_ps(dm, src + (i0 + i) * lds + d0) : _mm512_setzero_ps();
      transpose16(r);
      for (int64_t d = 0; d < nd; ++d) _mm512_mask_storeu_ps(dst + (d0 + d) * ldt + i0, im, r[d]);
    }
  }
}

// The row passes with the reductions as vector trees (a compiler-vectorised reduction ends in
// 16 dependent scalar adds per row, which cost more than the row's arithmetic).
RT_AVX512_TARGET void softmax_forward_avx512(float* s, int64_t ld, int64_t rows, int64_t n,
                                             bool diagonal, float* m, float* l, float* corr) {
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  const int64_t nvec = (n + kLanes - 1) / kLanes;  // <= 4: n <= kAttnTile
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * ld;
    const int64_t nr = diagonal ? r + 1 : n, live = (nr + kLanes - 1) / kLanes;
    __m512 x[4], vmax = neg_inf;
    for (int64_t v = 0; v < live; ++v) {
      x[v] = _mm512_mask_loadu_ps(neg_inf, v512::tail_mask(v * kLanes, nr), sr + v * kLanes);
      vmax = _mm512_max_ps(vmax, x[v]);
    }
    const float mx = std::max(m[r], _mm512_reduce_max_ps(vmax));
    const __m512 vmx = _mm512_set1_ps(mx);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t v = 0; v < live; ++v) {
      const __m512 p =
          _mm512_maskz_mov_ps(v512::tail_mask(v * kLanes, nr), v512::exp(_mm512_sub_ps(x[v], vmx)));
      _mm512_storeu_ps(sr + v * kLanes, p);
      vsum = _mm512_add_ps(vsum, p);
    }
    for (int64_t v = live; v < nvec; ++v) _mm512_storeu_ps(sr + v * kLanes, _mm512_setzero_ps());
    corr[r] = exp_fast(m[r] - mx);
    l[r] = l[r] * corr[r] + _mm512_reduce_add_ps(vsum);
    m[r] = mx;
  }
}

RT_AVX512_TARGET void softmax_backward_avx512(float* s, float* dp, int64_t ld, int64_t rows,
                                              int64_t n, bool diagonal, const float* lse,
                                              const float* delta, float scale) {
  const int64_t nvec = (n + kLanes - 1) / kLanes;
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < rows; ++r) {
    float *sr = s + r * ld, *dr = dp + r * ld;
    const int64_t nr = diagonal ? r + 1 : n, live = (nr + kLanes - 1) / kLanes;
    const __m512 li = _mm512_set1_ps(lse[r]), de = _mm512_set1_ps(delta[r]);
    for (int64_t v = 0; v < live; ++v) {
      const __mmask16 in = v512::tail_mask(v * kLanes, nr);
      const __m512 p =
          _mm512_maskz_mov_ps(in, v512::exp(_mm512_sub_ps(_mm512_loadu_ps(sr + v * kLanes), li)));
      const __m512 g = _mm512_sub_ps(_mm512_loadu_ps(dr + v * kLanes), de);
      _mm512_storeu_ps(sr + v * kLanes, p);
      _mm512_storeu_ps(dr + v * kLanes, _mm512_maskz_mul_ps(in, _mm512_mul_ps(p, g), vscale));
    }
    for (int64_t v = live; v < nvec; ++v) {  // wholly past the diagonal
      _mm512_storeu_ps(sr + v * kLanes, _mm512_setzero_ps());
      _mm512_storeu_ps(dr + v * kLanes, _mm512_setzero_ps());
    }
  }
}

RT_AVX512_TARGET void scale_rows_avx512(float* x, int64_t ld, int64_t rows, int64_t hs,
                                        const float* f) {
  scale_rows_body(x, ld, rows, hs, f);
}
RT_AVX512_TARGET void finish_rows_avx512(const float* acc, int64_t lda, int64_t rows, int64_t hs,
                                         const float* m, const float* l, float* out, int64_t ldo,
                                         float* lse) {
  finish_rows_body(acc, lda, rows, hs, m, l, out, ldo, lse);
}
RT_AVX512_TARGET void row_dots_avx512(const float* x, int64_t ldx, const float* y, int64_t ldy,
                                      int64_t rows, int64_t hs, float* dot) {
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * ldx, *yr = y + r * ldy;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < hs; d += kLanes) {
      const __mmask16 in = v512::tail_mask(d, hs);
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(in, xr + d), _mm512_maskz_loadu_ps(in, yr + d),
                            acc);
    }
    dot[r] = _mm512_reduce_add_ps(acc);
  }
}

#pragma GCC diagnostic pop

}  // namespace

const AttentionTileKernels& attention_tile_kernels(bool avx512) {
  static const AttentionTileKernels base{
      product_base,    transpose_base,   softmax_forward_base, softmax_backward_base,
      scale_rows_base, finish_rows_base, row_dots_base};
  static const AttentionTileKernels wide{
      product_avx512,    transpose_avx512,   softmax_forward_avx512, softmax_backward_avx512,
      scale_rows_avx512, finish_rows_avx512, row_dots_avx512};
  return avx512 ? wide : base;
}

}  // namespace ringtrain::kernels::cpu
