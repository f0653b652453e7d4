// The fp32 tile kernels of the CPU attention (cpu_attention.cpp): products on one tile of up to
// 64 x 64 scores held in registers by blocks of rows, the tile's softmax forward and backward,
// the transposes of a head's keys and values, and the per-row passes around them. Each comes
// compiled for baseline x86-64 and, with AVX-512 intrinsics, for CPUs that have it; the caller
// picks a set once (attention_tile_kernels).
#pragma once

#include <cstdint>

namespace ringtrain::kernels::cpu {

constexpr int64_t kAttnTile = 64;  // queries per tile and keys per tile

// The part of a diagonal tile (queries i0.., keys i0..) a product needs under the causal mask
// (query i sees keys j <= i). Skipped terms are exact zeros (masked probabilities), so the
// results equal the whole tile's.
enum class TileCausal {
  none,         // the whole tile
  cols_to_row,  // row r needs columns c <= r only (scores of query r over the tile's keys)
  k_to_row,     // row r sums over k <= r only (P V and dS K: row r is 0 past key r)
  k_from_row,   // row r sums over k >= r only (P^T dO and dS^T Q: key r gets nothing from
                // earlier queries)
};

// c[m, n] = alpha * A B (+ c when accumulate). A(r, k) = a[r * a_rs + k * a_cs], any strides
// (its elements are broadcast, so P^T is P with the strides swapped); B's row k is n
// contiguous floats at b + k * ldb; c's row r at c + r * ldc. n may exceed 64 (wide heads).
struct TileProduct {
  int64_t m, n, k;
  const float* a;
  int64_t a_rs, a_cs;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
  float alpha;
  bool accumulate;
  TileCausal causal;
};

// One tile's rows r < rows have columns [0, n_r) in play: n_r = r + 1 on the diagonal tile,
// else n. Columns [n_r, n) of the results are set to 0 (the products read them).
struct AttentionTileKernels {
  void (*product)(const TileProduct& p);
  // dst[d * ldt + i] = src[i * lds + d] for i < t, d < hs.
  void (*transpose)(const float* src, int64_t lds, int64_t t, int64_t hs, float* dst, int64_t ldt);
  // Online softmax step: per row, m (running maximum) and l (running sum of exp(s - m)) take
  // in this tile's scores s, which become exp(s - m_new); corr = exp(m_old - m_new), the
  // factor the row's partial output must be scaled by.
  void (*softmax_forward)(float* s, int64_t ld, int64_t rows, int64_t n, bool diagonal, float* m,
                          float* l, float* corr);
  // Backward: s becomes P = exp(s - lse), dp becomes dS = P (dp - delta) scale.
  void (*softmax_backward)(float* s, float* dp, int64_t ld, int64_t rows, int64_t n, bool diagonal,
                           const float* lse, const float* delta, float scale);
  // x[r * ld + d] *= f[r] for r < rows, d < hs.
  void (*scale_rows)(float* x, int64_t ld, int64_t rows, int64_t hs, const float* f);
  // out[r * ldo + d] = acc[r * lda + d] / l[r]; lse[r] = m[r] + log(l[r]).
  void (*finish_rows)(const float* acc, int64_t lda, int64_t rows, int64_t hs, const float* m,
                      const float* l, float* out, int64_t ldo, float* lse);
  // dot[r] = sum_d x[r * ldx + d] * y[r * ldy + d].
  void (*row_dots)(const float* x, int64_t ldx, const float* y, int64_t ldy, int64_t rows,
                   int64_t hs, float* dot);
};

// The AVX-512 set when `avx512` (the caller checks the CPU), else the baseline one.
const AttentionTileKernels& attention_tile_kernels(bool avx512);

}  // namespace ringtrain::kernels::cpu
