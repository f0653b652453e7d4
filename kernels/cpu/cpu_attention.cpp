// CPU causal multi-head self-attention on fp32 tiles (cpu_attention_gemm.cpp runs it as oneDNN
// tile GEMMs where CpuOptions::attention says: bf16 on AMX), blocked as FlashAttention: per
// (batch, head), query tiles of 64 rows against key tiles of 64 up to the diagonal. Per tile
// pair the 64 x 64 scores are one register-blocked product (attention_tiles.hpp), then an
// online softmax (running maximum and sum per query, the partial output rescaled when the
// maximum grows), then P V as a second product, so at most one tile of scores exists at a time
// and never the T x T matrix. Forward saves each query's log-sum-exp; backward recomputes P
// from it and forms dV += P^T dO, dK += dS^T Q and dQ += dS K as tile products too.
// fp32 tensors are read and written in place (a head is a column block of qkv [B*T, 3C] and
// out [B*T, C]); 16-bit ones are widened to fp32 per head and rounded once on the way out.
// One (batch, head) per thread: each output element is written by one thread in a fixed order
// (deterministic for any thread count).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_tiles.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace ringtrain::kernels::cpu {

namespace {

constexpr int64_t kTile = kAttnTile;

// One head's operands as fp32 row-major views: row i of q at q + i * ld_qkv (k, v alike), of
// the output o / its gradient g at + i * ld_o / ld_g, of dq, dk, dv at + i * ld_dqkv.
struct HeadView {
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t ld_qkv = 0;
  float* o = nullptr;  // written by forward, read by backward
  int64_t ld_o = 0;
  const float* g = nullptr;  // dO and below: backward only
  int64_t ld_g = 0;
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;
  int64_t ld_dqkv = 0;
};

// A thread's working memory, kept between calls (sized once per shape).
struct Scratch {
  int64_t ldt = 0;            // row length of the transposes: T rounded up to 16
  std::vector<float> kt, vt;  // k and v transposed [hs, ldt]
  std::vector<float> s, dp;   // a tile of scores / P and of dP / dS [kTile, kTile]
  std::vector<float> acc;     // forward: a query tile's unnormalised output [kTile, hs]
  float m[kTile], l[kTile], corr[kTile], delta[kTile];
  std::vector<float> dense;  // 16-bit inputs: the head's fp32 copies and results
  void size(int64_t t, int64_t hs, int64_t dense_blocks) {
    ldt = (t + 15) / 16 * 16;
    for (auto* b : {&kt, &vt}) b->resize(size_t(hs * ldt));
    for (auto* b : {&s, &dp}) b->resize(size_t(kTile * kTile));
    acc.resize(size_t(kTile * hs));
    dense.resize(size_t(dense_blocks * t * hs));
  }
};

// Forward of one head: o [T, hs] and lse [T].
void head_forward(const AttentionTileKernels& kr, const HeadView& h, int64_t t, int64_t hs,
                  float scale, float* lse, Scratch& sc) {
  const int64_t ld = h.ld_qkv;
  kr.transpose(h.k, ld, t, hs, sc.kt.data(), sc.ldt);
  float *s = sc.s.data(), *acc = sc.acc.data();
  for (int64_t i0 = 0; i0 < t; i0 += kTile) {
    const int64_t rows = std::min(kTile, t - i0);
    std::fill(sc.m, sc.m + rows, -std::numeric_limits<float>::infinity());
    std::fill(sc.l, sc.l + rows, 0.f);
    for (int64_t j0 = 0; j0 <= i0; j0 += kTile) {
      const bool diag = j0 == i0;
      const int64_t nk = diag ? rows : kTile;
      // S = scale Q_i K_j^T, then P = exp(S - m) with the running statistics
      kr.product({rows, nk, hs, h.q + i0 * ld, ld, 1, sc.kt.data() + j0, sc.ldt, s, kTile, scale,
                  false, diag ? TileCausal::cols_to_row : TileCausal::none});
      kr.softmax_forward(s, kTile, rows, nk, diag, sc.m, sc.l, sc.corr);
      if (j0 > 0) kr.scale_rows(acc, hs, rows, hs, sc.corr);
      // acc (+)= P V_j
      kr.product({rows, hs, nk, s, kTile, 1, h.v + j0 * ld, ld, acc, hs, 1.f, j0 > 0,
                  diag ? TileCausal::k_to_row : TileCausal::none});
    }
    kr.finish_rows(acc, hs, rows, hs, sc.m, sc.l, h.o + i0 * h.ld_o, h.ld_o, lse + i0);
  }
}

// Backward of one head: dq, dk, dv [T, hs] (each written whole) from q, k, v, o, dO and lse.
void head_backward(const AttentionTileKernels& kr, const HeadView& h, int64_t t, int64_t hs,
                   float scale, const float* lse, Scratch& sc) {
  const int64_t ld = h.ld_qkv, ldd = h.ld_dqkv;
  kr.transpose(h.k, ld, t, hs, sc.kt.data(), sc.ldt);
  kr.transpose(h.v, ld, t, hs, sc.vt.data(), sc.ldt);
  float *s = sc.s.data(), *dp = sc.dp.data();
  for (int64_t i0 = 0; i0 < t; i0 += kTile) {
    const int64_t rows = std::min(kTile, t - i0);
    const float *q = h.q + i0 * ld, *g = h.g + i0 * h.ld_g;
    // delta_i = rowsum(dO * O): the softmax Jacobian's diagonal term
    kr.row_dots(h.o + i0 * h.ld_o, h.ld_o, g, h.ld_g, rows, hs, sc.delta);
    for (int64_t j0 = 0; j0 <= i0; j0 += kTile) {
      const bool diag = j0 == i0;
      const int64_t nk = diag ? rows : kTile;
      const TileCausal cols = diag ? TileCausal::cols_to_row : TileCausal::none;
      kr.product({rows, nk, hs, q, ld, 1, sc.kt.data() + j0, sc.ldt, s, kTile, scale, false, cols});
      kr.product(
          {rows, nk, hs, g, h.ld_g, 1, sc.vt.data() + j0, sc.ldt, dp, kTile, 1.f, false, cols});
      kr.softmax_backward(s, dp, kTile, rows, nk, diag, lse + i0, sc.delta, scale);
      // Key tile j0 first meets queries on the diagonal (i0 == j0): written there, summed after.
      const TileCausal keys = diag ? TileCausal::k_from_row : TileCausal::none;
      kr.product({nk, hs, rows, s, 1, kTile, g, h.ld_g, h.dv + j0 * ldd, ldd, 1.f, !diag, keys});
      kr.product({nk, hs, rows, dp, 1, kTile, q, ld, h.dk + j0 * ldd, ldd, 1.f, !diag, keys});
      kr.product({rows, hs, nk, dp, kTile, 1, h.k + j0 * ld, ld, h.dq + i0 * ldd, ldd, 1.f, j0 > 0,
                  diag ? TileCausal::k_to_row : TileCausal::none});
    }
  }
}

// Rows [0, t) of `hs` elements at column `col` of a [*, stride] tensor from row `base` on, to
// or from a dense fp32 [t, hs] block.
void widen_rows(const Tensor& src, int64_t base, int64_t stride, int64_t col, int64_t t, int64_t hs,
                float* dst) {
  const size_t sz = dtype_size(src.dtype);
  for (int64_t i = 0; i < t; ++i)
    to_f32(static_cast<const char*>(src.data) + ((base + i) * stride + col) * int64_t(sz),
           src.dtype, dst + i * hs, hs, 1);
}
void round_rows(const float* src, int64_t t, int64_t hs, const Tensor& dst, int64_t base,
                int64_t stride, int64_t col) {
  const size_t sz = dtype_size(dst.dtype);
  for (int64_t i = 0; i < t; ++i)
    from_f32(src + i * hs, static_cast<char*>(dst.data) + ((base + i) * stride + col) * int64_t(sz),
             dst.dtype, hs, 1);
}

// Runs fn(scratch, u, base, col) for every (sample, head) unit u over `threads` threads
// (base: the sample's first row; col: the head's first column), each thread with its own
// scratch sized for `dense_blocks` [T, hs] fp32 blocks.
template <typename Fn>
void for_each_head(const AttentionDims& d, int threads, int64_t dense_blocks, Fn&& fn) {
  const int64_t units = d.b * d.heads;
#pragma omp parallel num_threads(threads) if (threads > 1 && units > 1)
  {
    thread_local Scratch sc;
    sc.size(d.t, d.hs, dense_blocks);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) fn(sc, u, u / d.heads * d.t, u % d.heads * d.hs);
  }
}

}  // namespace

void CpuBackend::do_attention_forward(int64_t heads, const Tensor& qkv, const Tensor& out,
                                      const Tensor& lse) {
  const AttentionDims d = attention_dims(heads, qkv, out, lse);
  if (attention_as_gemms(qkv, qkv)) return attention_forward_gemm(d, qkv, out, lse);
  const float scale = 1.f / std::sqrt(float(d.hs));
  const AttentionTileKernels& kr = attention_tile_kernels(opts_.attention_avx512 && use_avx512());
  const bool f32 = qkv.dtype == DType::f32 && out.dtype == DType::f32;
  const int64_t t = d.t, hs = d.hs, c = d.c;
  for_each_head(d, threads_, f32 ? 0 : 4, [&](Scratch& sc, int64_t u, int64_t base, int64_t col) {
    float* l = lse.as<float>() + u * t;
    if (f32) {
      const float* x = qkv.as<float>() + base * 3 * c + col;
      const HeadView h{.q = x,
                       .k = x + c,
                       .v = x + 2 * c,
                       .ld_qkv = 3 * c,
                       .o = out.as<float>() + base * c + col,
                       .ld_o = c};
      return head_forward(kr, h, t, hs, scale, l, sc);
    }
    float* q = sc.dense.data();  // q, k, v, o: [T, hs] each
    for (int64_t part = 0; part < 3; ++part)
      widen_rows(qkv, base, 3 * c, part * c + col, t, hs, q + part * t * hs);
    const HeadView h{.q = q,
                     .k = q + t * hs,
                     .v = q + 2 * t * hs,
                     .ld_qkv = hs,
                     .o = q + 3 * t * hs,
                     .ld_o = hs};
    head_forward(kr, h, t, hs, scale, l, sc);
    round_rows(h.o, t, hs, out, base, c, col);
  });
}

void CpuBackend::do_attention_backward(int64_t heads, const Tensor& qkv, const Tensor& out,
                                       const Tensor& dout, const Tensor& lse, const Tensor& dqkv) {
  const AttentionDims d = attention_dims(heads, qkv, out, lse);
  if (attention_as_gemms(qkv, dout)) return attention_backward_gemm(d, qkv, out, dout, lse, dqkv);
  const float scale = 1.f / std::sqrt(float(d.hs));
  const AttentionTileKernels& kr = attention_tile_kernels(opts_.attention_avx512 && use_avx512());
  const bool f32 = qkv.dtype == DType::f32 && out.dtype == DType::f32 && dout.dtype == DType::f32 &&
                   dqkv.dtype == DType::f32;
  const int64_t t = d.t, hs = d.hs, c = d.c;
  for_each_head(d, threads_, f32 ? 0 : 8, [&](Scratch& sc, int64_t u, int64_t base, int64_t col) {
    const float* l = lse.as<float>() + u * t;
    if (f32) {
      const float* x = qkv.as<float>() + base * 3 * c + col;
      float* dx = dqkv.as<float>() + base * 3 * c + col;
      const HeadView h{.q = x,
                       .k = x + c,
                       .v = x + 2 * c,
                       .ld_qkv = 3 * c,
                       .o = out.as<float>() + base * c + col,
                       .ld_o = c,
                       .g = dout.as<float>() + base * c + col,
                       .ld_g = c,
                       .dq = dx,
                       .dk = dx + c,
                       .dv = dx + 2 * c,
                       .ld_dqkv = 3 * c};
      return head_backward(kr, h, t, hs, scale, l, sc);
    }
    // q, k, v, o, dO, then dq, dk, dv: [T, hs] each
    float* b = sc.dense.data();
    const auto block = [&](int i) { return b + i * t * hs; };
    for (int64_t part = 0; part < 3; ++part)
      widen_rows(qkv, base, 3 * c, part * c + col, t, hs, block(int(part)));
    widen_rows(out, base, c, col, t, hs, block(3));
    widen_rows(dout, base, c, col, t, hs, block(4));
    const HeadView h{.q = block(0),
                     .k = block(1),
                     .v = block(2),
                     .ld_qkv = hs,
                     .o = block(3),
                     .ld_o = hs,
                     .g = block(4),
                     .ld_g = hs,
                     .dq = block(5),
                     .dk = block(6),
                     .dv = block(7),
                     .ld_dqkv = hs};
    head_backward(kr, h, t, hs, scale, l, sc);
    for (int64_t part = 0; part < 3; ++part)
      round_rows(block(5 + int(part)), t, hs, dqkv, base, 3 * c, part * c + col);
  });
}

RT_KERNEL_FAMILY(cpu, attention) { table.declare(op_name(Op::attention), kFloatDTypes); }
}  // namespace ringtrain::kernels::cpu
