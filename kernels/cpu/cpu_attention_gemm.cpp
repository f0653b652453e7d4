// CPU causal multi-head self-attention as tile GEMMs through oneDNN: the path CpuBackend takes
// when oneDNN is its GEMM provider and runs bf16 natively (CpuOptions::attention;
// cpu_attention.cpp's own tile kernels otherwise). Per (batch, head) and query tile of kTile rows,
// keys 0 .. n-1 up to the tile's last query:
//   forward   S = scale Q K^T [rows, n] (GEMM), P = softmax(S) row by row under the causal
//             mask (fp32), O = P V (GEMM) straight into the output; lse saved per query.
//   backward  S recomputed, P = exp(S - lse), dP = dO V^T (GEMM), dS = P (dP - delta) scale,
//             dV += P^T dO and dK += dS^T Q (GEMMs into fp32 accumulators), dQ = dS K (GEMM).
// So at most one tile row of scores [kTile, T] exists at a time, never the T x T matrix. A
// head's q, k, v (and dO) are first copied to dense [T, hs] blocks in their own dtype: oneDNN
// runs its brgemm (AMX) kernels on dense operands only, strided ones fall to a slower GEMM. The
// GEMM inputs are the tensors' own dtype when oneDNN runs it natively (bf16 with AMX; P and dS
// are then rounded to it, as GPU flash attention does), else fp32 (16-bit widened once).
// One (batch, head) per thread, every oneDNN call single-threaded inside it: each output
// element is computed by one thread in a fixed order, for any thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace ringtrain::kernels::cpu {

namespace {

constexpr int64_t kTile = 64;  // queries per tile

// Row softmax over the first `valid` of n scores (the rest masked to 0); returns the row's
// log-sum-exp.
RT_INLINE float softmax_row_body(float* s, int64_t valid, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < valid; ++j) mx = s[j] > mx ? s[j] : mx;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    const float p = j < valid ? exp_fast(s[j] - mx) : 0.f;
    s[j] = p;
    sum += p;
  }
  const float inv = 1.f / sum;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
  return mx + std::log(sum);
}

// p = exp(s - lse) on the first `valid` of n (0 after); dp becomes dS = p (dp - delta) scale.
RT_INLINE void softmax_grad_row_body(float* s, float* dp, int64_t valid, int64_t n, float lse,
                                     float delta, float scale) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float p = j < valid ? exp_fast(s[j] - lse) : 0.f;
    s[j] = p;
    dp[j] = p * (dp[j] - delta) * scale;
  }
}

float softmax_row_base(float* s, int64_t valid, int64_t n) { return softmax_row_body(s, valid, n); }
RT_AVX512_TARGET float softmax_row_avx512(float* s, int64_t valid, int64_t n) {
  return softmax_row_body(s, valid, n);
}
void softmax_grad_row_base(float* s, float* dp, int64_t valid, int64_t n, float lse, float delta,
                           float scale) {
  softmax_grad_row_body(s, dp, valid, n, lse, delta, scale);
}
RT_AVX512_TARGET void softmax_grad_row_avx512(float* s, float* dp, int64_t valid, int64_t n,
                                              float lse, float delta, float scale) {
  softmax_grad_row_body(s, dp, valid, n, lse, delta, scale);
}

// Element offset arithmetic on untyped pointers of a dtype.
const char* at(const void* p, int64_t elems, DType t) {
  return static_cast<const char*>(p) + elems * int64_t(dtype_size(t));
}
char* at(void* p, int64_t elems, DType t) {
  return static_cast<char*>(p) + elems * int64_t(dtype_size(t));
}

// Rows [0, t) of `hs` elements from a row-major array with rows every `ld` elements into a
// dense [t, hs] block, and back.
void gather(const void* src, int64_t ld, int64_t t, int64_t hs, DType dt, void* dst) {
  const size_t row = size_t(hs) * dtype_size(dt);
  for (int64_t i = 0; i < t; ++i) std::memcpy(at(dst, i * hs, dt), at(src, i * ld, dt), row);
}
void scatter(const void* src, int64_t t, int64_t hs, DType dt, void* dst, int64_t ld) {
  const size_t row = size_t(hs) * dtype_size(dt);
  for (int64_t i = 0; i < t; ++i) std::memcpy(at(dst, i * ld, dt), at(src, i * hs, dt), row);
}

// Runs fn(state, u, base, col) for every (sample, head) unit over `threads` threads, with
// per-thread buffers `State` kept between calls (size(state) sizes them: no allocation per
// step once sized); oneDNN runs single-threaded inside (the thread's own ICV).
template <typename State, typename Size, typename Fn>
void for_each_unit(const AttentionDims& d, int threads, Size&& size, Fn&& fn) {
  const int64_t units = d.b * d.heads;
#pragma omp parallel num_threads(threads)
  {
    omp_set_num_threads(1);  // this thread's nested regions (oneDNN's) get one thread
    thread_local State state;
    size(state);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) fn(state, u, u / d.heads * d.t, u % d.heads * d.hs);
  }
}

}  // namespace

bool CpuBackend::attention_as_gemms(const Tensor& a, const Tensor& b) {
  using Path = CpuOptions::AttentionPath;
  if (opts_.attention == Path::tile_kernels) return false;
  if (opts_.attention == Path::gemm) return true;
  return opts_.gemm == GemmProvider::onednn && attention_gemm_dtype(a, b) != DType::f32;
}

DType CpuBackend::attention_gemm_dtype(const Tensor& a, const Tensor& b) {
  if (a.dtype == b.dtype && (a.dtype == DType::f32 || native(a.dtype))) return a.dtype;
  return DType::f32;
}

void CpuBackend::attention_forward_gemm(const AttentionDims& d, const Tensor& qkv,
                                        const Tensor& out, const Tensor& lse) {
  const DType in = attention_gemm_dtype(qkv, qkv);
  const void* x = as_dtype(qkv, in, scratch_a_);
  // The output straight from the GEMM when oneDNN writes its dtype, else via fp32.
  const bool direct = out.dtype == in || out.dtype == DType::f32;
  const DType ydt = direct ? out.dtype : DType::f32;
  void* y = out.data;
  if (!direct) {
    scratch_c_.resize(size_t(out.numel()));
    y = scratch_c_.data();
  }
  const float scale = 1.f / std::sqrt(float(d.hs));
  const bool avx512 = use_avx512();
  const int64_t ldx = 3 * d.c, t = d.t, hs = d.hs;
  OneDnnMatmul& mm = matmul();
  struct State {
    // the head's q, k, v and output [T, hs] (dense, fp32-sized); scores [kTile, T] fp32 and
    // the probabilities in `in`
    std::vector<float> q, k, v, o, s, p;
  };
  auto size = [&](State& st) {
    for (auto* b : {&st.q, &st.k, &st.v, &st.o}) b->resize(size_t(t * hs));
    for (auto* b : {&st.s, &st.p}) b->resize(size_t(kTile * t));
  };
  for_each_unit<State>(d, threads_, size, [&](State& st, int64_t u, int64_t base, int64_t col) {
    gather(at(x, base * ldx + col, in), ldx, t, hs, in, st.q.data());
    gather(at(x, base * ldx + d.c + col, in), ldx, t, hs, in, st.k.data());
    gather(at(x, base * ldx + 2 * d.c + col, in), ldx, t, hs, in, st.v.data());
    float* l = lse.as<float>() + u * t;
    for (int64_t i0 = 0; i0 < t; i0 += kTile) {
      const int64_t rows = std::min(kTile, t - i0), n = i0 + rows;
      mm.run(false, true, rows, n, hs, scale, at(st.q.data(), i0 * hs, in), st.k.data(), in, 0.f,
             st.s.data(), DType::f32);
      for (int64_t r = 0; r < rows; ++r) {
        float* sr = st.s.data() + r * n;
        l[i0 + r] =
            avx512 ? softmax_row_avx512(sr, i0 + r + 1, n) : softmax_row_base(sr, i0 + r + 1, n);
      }
      const void* p = st.s.data();
      if (in != DType::f32) {
        from_f32(st.s.data(), st.p.data(), in, rows * n, 1);
        p = st.p.data();
      }
      mm.run(false, false, rows, hs, n, 1.f, p, st.v.data(), in, 0.f, at(st.o.data(), i0 * hs, ydt),
             ydt);
    }
    scatter(st.o.data(), t, hs, ydt, at(y, base * d.c + col, ydt), d.c);
  });
  if (!direct) from_f32(scratch_c_.data(), out.data, out.dtype, out.numel(), threads_);
}

void CpuBackend::attention_backward_gemm(const AttentionDims& d, const Tensor& qkv,
                                         const Tensor& out, const Tensor& dout, const Tensor& lse,
                                         const Tensor& dqkv) {
  const DType in = attention_gemm_dtype(qkv, dout);
  const void* x = as_dtype(qkv, in, scratch_a_);
  const void* dy = as_dtype(dout, in, scratch_b_);
  // dQ straight from its GEMM in dqkv's dtype when oneDNN writes it, else via fp32.
  const DType dqdt = dqkv.dtype == in || dqkv.dtype == DType::f32 ? dqkv.dtype : DType::f32;
  const float scale = 1.f / std::sqrt(float(d.hs));
  const bool avx512 = use_avx512();
  const int64_t ldx = 3 * d.c, t = d.t, hs = d.hs;
  OneDnnMatmul& mm = matmul();
  struct State {
    // the head's q, k, v, dO, dQ [T, hs] (dense, fp32-sized); dK, dV [T, hs] fp32; scores /
    // probabilities and dP / dS [kTile, T] in fp32 and in `in`; delta per query; a row of O
    // and dO in fp32
    std::vector<float> q, k, v, g, dq, dk, dv, s, dp, p, ds, delta, orow, grow;
  };
  auto size = [&](State& st) {
    for (auto* b : {&st.q, &st.k, &st.v, &st.g, &st.dq, &st.dk, &st.dv}) b->resize(size_t(t * hs));
    for (auto* b : {&st.s, &st.dp, &st.p, &st.ds}) b->resize(size_t(kTile * t));
    st.delta.resize(size_t(t));
    st.orow.resize(size_t(hs));
    st.grow.resize(size_t(hs));
  };
  for_each_unit<State>(d, threads_, size, [&](State& st, int64_t u, int64_t base, int64_t col) {
    gather(at(x, base * ldx + col, in), ldx, t, hs, in, st.q.data());
    gather(at(x, base * ldx + d.c + col, in), ldx, t, hs, in, st.k.data());
    gather(at(x, base * ldx + 2 * d.c + col, in), ldx, t, hs, in, st.v.data());
    gather(at(dy, base * d.c + col, in), d.c, t, hs, in, st.g.data());
    const float* l = lse.as<float>() + u * t;
    // delta_i = rowsum(dO * O): the softmax Jacobian's diagonal term, from the saved output.
    for (int64_t i = 0; i < t; ++i) {
      to_f32(at(out.data, (base + i) * d.c + col, out.dtype), out.dtype, st.orow.data(), hs, 1);
      to_f32(at(dout.data, (base + i) * d.c + col, dout.dtype), dout.dtype, st.grow.data(), hs, 1);
      float acc = 0.f;
      for (int64_t c = 0; c < hs; ++c) acc += st.orow[size_t(c)] * st.grow[size_t(c)];
      st.delta[size_t(i)] = acc;
    }
    std::fill(st.dk.begin(), st.dk.end(), 0.f);
    std::fill(st.dv.begin(), st.dv.end(), 0.f);
    for (int64_t i0 = 0; i0 < t; i0 += kTile) {
      const int64_t rows = std::min(kTile, t - i0), n = i0 + rows;
      const void* qt = at(st.q.data(), i0 * hs, in);
      const void* gt = at(st.g.data(), i0 * hs, in);
      mm.run(false, true, rows, n, hs, scale, qt, st.k.data(), in, 0.f, st.s.data(), DType::f32);
      mm.run(false, true, rows, n, hs, 1.f, gt, st.v.data(), in, 0.f, st.dp.data(), DType::f32);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        float *sr = st.s.data() + r * n, *dr = st.dp.data() + r * n;
        if (avx512)
          softmax_grad_row_avx512(sr, dr, i + 1, n, l[i], st.delta[size_t(i)], scale);
        else
          softmax_grad_row_base(sr, dr, i + 1, n, l[i], st.delta[size_t(i)], scale);
      }
      const void* p = st.s.data();
      const void* ds = st.dp.data();
      if (in != DType::f32) {
        from_f32(st.s.data(), st.p.data(), in, rows * n, 1);
        from_f32(st.dp.data(), st.ds.data(), in, rows * n, 1);
        p = st.p.data();
        ds = st.ds.data();
      }
      // dV[0, n) += P^T dO_tile, dK[0, n) += dS^T Q_tile, dQ_tile = dS K[0, n).
      mm.run(true, false, n, hs, rows, 1.f, p, gt, in, 1.f, st.dv.data(), DType::f32);
      mm.run(true, false, n, hs, rows, 1.f, ds, qt, in, 1.f, st.dk.data(), DType::f32);
      mm.run(false, false, rows, hs, n, 1.f, ds, st.k.data(), in, 0.f,
             at(st.dq.data(), i0 * hs, dqdt), dqdt);
    }
    const auto put = [&](const float* src, int64_t off) {  // fp32 [T, hs] -> dqkv columns
      for (int64_t j = 0; j < t; ++j)
        from_f32(src + j * hs, at(dqkv.data, (base + j) * ldx + off, dqkv.dtype), dqkv.dtype, hs,
                 1);
    };
    if (dqdt == dqkv.dtype)
      scatter(st.dq.data(), t, hs, dqdt, at(dqkv.data, base * ldx + col, dqdt), ldx);
    else
      put(st.dq.data(), col);
    put(st.dk.data(), d.c + col);
    put(st.dv.data(), 2 * d.c + col);
  });
}

}  // namespace ringtrain::kernels::cpu
