// CPU elementwise ops of the layers (the pointwise family): dropout with counter-based masks, and
// the add of residual connections and gradient sums, and the mul of a gated MLP and its backward
// (with AVX-512 one pass over any float dtypes, 16-bit operands widened and the results rounded
// in registers).
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"
#include "kernels/cpu/vec512.hpp"

namespace ringtrain::kernels::cpu {

namespace {

// mask[i] = dropout_uniform(seed, i) >= p. The hash's 64-bit multiplies vectorise with
// AVX-512DQ; the loop is inlined into a baseline and an AVX-512 function, chosen at run time.
__attribute__((always_inline)) inline void dropout_mask_body(uint64_t seed, float p, int64_t begin,
                                                             int64_t end, uint8_t* mask) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) mask[i] = dropout_uniform(seed, uint64_t(i)) >= p;
}

void dropout_mask_base(uint64_t seed, float p, int64_t begin, int64_t end, uint8_t* mask) {
  dropout_mask_body(seed, p, begin, end, mask);
}

__attribute__((target("avx512f,avx512dq"))) void dropout_mask_avx512(uint64_t seed, float p,
                                                                     int64_t begin, int64_t end,
                                                                     uint8_t* mask) {
  dropout_mask_body(seed, p, begin, end, mask);
}

void dropout_mask(uint64_t seed, float p, int64_t begin, int64_t end, uint8_t* mask) {
  static const bool avx512 = __builtin_cpu_supports("avx512dq");
  if (avx512)
    dropout_mask_avx512(seed, p, begin, end, mask);
  else
    dropout_mask_base(seed, p, begin, end, mask);
}

// out[i] = in[i] * scale where mask[i], else 0: dropout's forward after the mask, and its
// backward. Inlined into a baseline and an AVX-512 function as the mask is (the u8 mask
// widens to a lane mask in one instruction there).
template <typename E, typename S = typename E::storage>
__attribute__((always_inline)) inline void dropout_apply_body(const S* in, const uint8_t* mask,
                                                              float scale, int64_t begin,
                                                              int64_t end, S* out) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) out[i] = E::store(mask[i] ? E::load(in[i]) * scale : 0.f);
}

template <typename E, typename S = typename E::storage>
void dropout_apply_base(const S* in, const uint8_t* mask, float scale, int64_t begin, int64_t end,
                        S* out) {
  dropout_apply_body<E>(in, mask, scale, begin, end, out);
}

template <typename E, typename S = typename E::storage>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void dropout_apply_avx512(
    const S* in, const uint8_t* mask, float scale, int64_t begin, int64_t end, S* out) {
  dropout_apply_body<E>(in, mask, scale, begin, end, out);
}

template <typename E, typename S = typename E::storage>
void dropout_apply(const S* in, const uint8_t* mask, float scale, int64_t begin, int64_t end,
                   S* out) {
  static const bool avx512 = __builtin_cpu_supports("avx512f") &&
                             __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl");
  if (avx512)
    dropout_apply_avx512<E>(in, mask, scale, begin, end, out);
  else
    dropout_apply_base<E>(in, mask, scale, begin, end, out);
}

// y[lo, hi) = a + b in fp32, rounded once to y's dtype; y may alias a or b.
template <DType T, bool kNative>
RT_AVX512_TARGET void add_avx512(const Tensor& a, const Tensor& b, const Tensor& y, int64_t lo,
                                 int64_t hi) {
  const DType ta = v512::dtype<T>(a), tb = v512::dtype<T>(b), ty = v512::dtype<T>(y);
  for (int64_t i = lo; i < hi; i += 16) {
    const __mmask16 m = v512::tail_mask(i, hi);
    v512::store<kNative>(y.data, ty, i, m,
                         _mm512_add_ps(v512::load(a.data, ta, i, m), v512::load(b.data, tb, i, m)));
  }
}
template <DType T, bool kNative>
struct AddAvx512 {
  void operator()(const Tensor& a, const Tensor& b, const Tensor& y, int64_t lo, int64_t hi) const {
    add_avx512<T, kNative>(a, b, y, lo, hi);
  }
};

// y = a * b, and da = dy * b, db = dy * a, over [lo, hi) in fp32, rounded once.
template <DType T, bool kNative>
RT_AVX512_TARGET void mul_avx512(const Tensor& a, const Tensor& b, const Tensor& y, int64_t lo,
                                 int64_t hi) {
  const DType ta = v512::dtype<T>(a), tb = v512::dtype<T>(b), ty = v512::dtype<T>(y);
  for (int64_t i = lo; i < hi; i += 16) {
    const __mmask16 m = v512::tail_mask(i, hi);
    v512::store<kNative>(y.data, ty, i, m,
                         _mm512_mul_ps(v512::load(a.data, ta, i, m), v512::load(b.data, tb, i, m)));
  }
}
template <DType T, bool kNative>
struct MulAvx512 {
  void operator()(const Tensor& a, const Tensor& b, const Tensor& y, int64_t lo, int64_t hi) const {
    mul_avx512<T, kNative>(a, b, y, lo, hi);
  }
};
template <DType T, bool kNative>
RT_AVX512_TARGET void mul_backward_avx512(const Tensor& a, const Tensor& b, const Tensor& dy,
                                          const Tensor& da, const Tensor& db, int64_t lo,
                                          int64_t hi) {
  const DType ta = v512::dtype<T>(a), tb = v512::dtype<T>(b), td = v512::dtype<T>(dy);
  const DType tda = v512::dtype<T>(da), tdb = v512::dtype<T>(db);
  for (int64_t i = lo; i < hi; i += 16) {
    const __mmask16 m = v512::tail_mask(i, hi);
    const __m512 g = v512::load(dy.data, td, i, m);
    const __m512 va = v512::load(a.data, ta, i, m), vb = v512::load(b.data, tb, i, m);
    v512::store<kNative>(da.data, tda, i, m, _mm512_mul_ps(g, vb));
    v512::store<kNative>(db.data, tdb, i, m, _mm512_mul_ps(g, va));
  }
}
template <DType T, bool kNative>
struct MulBackwardAvx512 {
  void operator()(const Tensor& a, const Tensor& b, const Tensor& dy, const Tensor& da,
                  const Tensor& db, int64_t lo, int64_t hi) const {
    mul_backward_avx512<T, kNative>(a, b, dy, da, db, lo, hi);
  }
};

// Element i of t.
char* elem_at(const Tensor& t, int64_t i) {
  return static_cast<char*>(t.data) + i * int64_t(dtype_size(t.dtype));
}

// body(in, out, m) over [0, n) in blocks of fp32 copies: the inputs `ins` widened into `in`
// (one block each), then the outputs `outs` rounded from `out` (the baseline's 16-bit path).
template <size_t kIn, size_t kOut, typename Body>
void widened_blocks(int64_t n, int threads, const std::array<const Tensor*, kIn>& ins,
                    const std::array<const Tensor*, kOut>& outs, Body body) {
  constexpr int64_t kBlock = 1024;
  parallel_chunks(n, threads, [&](int64_t lo, int64_t hi) {
    float in[kIn][kBlock], out[kOut][kBlock];
    for (int64_t i = lo; i < hi; i += kBlock) {
      const int64_t m = std::min(kBlock, hi - i);
      for (size_t k = 0; k < kIn; ++k) to_f32(elem_at(*ins[k], i), ins[k]->dtype, in[k], m, 1);
      body(in, out, m);
      for (size_t k = 0; k < kOut; ++k)
        from_f32(out[k], elem_at(*outs[k], i), outs[k]->dtype, m, 1);
    }
  });
}

}  // namespace

void CpuBackend::do_mul(const Tensor& a, const Tensor& b, const Tensor& y) {
  const int64_t n = a.numel();
  if (use_avx512()) return v512::run<MulAvx512>(n, threads_, a, b, y);
  widened_blocks<2, 1>(n, threads_, {&a, &b}, {&y}, [](auto& in, auto& out, int64_t m) {
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) out[0][j] = in[0][j] * in[1][j];
  });
}

void CpuBackend::do_mul_backward(const Tensor& a, const Tensor& b, const Tensor& dy,
                                 const Tensor& da, const Tensor& db) {
  const int64_t n = a.numel();
  if (use_avx512()) return v512::run<MulBackwardAvx512>(n, threads_, a, b, dy, da, db);
  widened_blocks<3, 2>(n, threads_, {&a, &b, &dy}, {&da, &db}, [](auto& in, auto& out, int64_t m) {
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) {
      out[0][j] = in[2][j] * in[1][j];
      out[1][j] = in[2][j] * in[0][j];
    }
  });
}

void CpuBackend::do_dropout_forward(const Tensor& x, float p, uint64_t seed, const Tensor& y,
                                    const Tensor& mask) {
  const int64_t n = x.numel();
  const float keep_scale = 1.f / (1.f - p);
  auto* pm = mask.as<uint8_t>();
  dispatch_float(x.dtype, [&](auto X) {
    using E = decltype(X);
    const auto* px = x.as<typename E::storage>();
    auto* py = y.as<typename E::storage>();
    constexpr int64_t kChunk = 4096;
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
    for (int64_t c = 0; c < n; c += kChunk) {
      const int64_t end = std::min(n, c + kChunk);
      dropout_mask(seed, p, c, end, pm);
      dropout_apply<E>(px, pm, keep_scale, c, end, py);
    }
  });
}

void CpuBackend::do_dropout_backward(const Tensor& dy, const Tensor& mask, float p,
                                     const Tensor& dx) {
  const int64_t n = dy.numel();
  const float keep_scale = 1.f / (1.f - p);
  const auto* pm = mask.as<uint8_t>();
  dispatch_float(dy.dtype, [&](auto D) {
    using E = decltype(D);
    const auto* pd = dy.as<typename E::storage>();
    auto* px = dx.as<typename E::storage>();
    parallel_chunks(n, threads_, [&](int64_t lo, int64_t hi) {
      dropout_apply<E>(pd, pm, keep_scale, lo, hi, px);
    });
  });
}

void CpuBackend::do_add(const Tensor& a, const Tensor& b, const Tensor& y) {
  const int64_t n = a.numel();
  if (use_avx512()) return v512::run<AddAvx512>(n, threads_, a, b, y);
  if (a.dtype != DType::f32 || b.dtype != DType::f32 || y.dtype != DType::f32) {
    // 16-bit operands widened and the sums rounded by the vector casts, a block at a time.
    constexpr int64_t kBlock = 1024;
    const auto elem = [](const Tensor& t, int64_t i) {
      return static_cast<char*>(t.data) + i * int64_t(dtype_size(t.dtype));
    };
    parallel_chunks(n, threads_, [&](int64_t lo, int64_t hi) {
      float ab[kBlock], bb[kBlock];
      for (int64_t i = lo; i < hi; i += kBlock) {
        const int64_t m = std::min(kBlock, hi - i);
        to_f32(elem(a, i), a.dtype, ab, m, 1);
        to_f32(elem(b, i), b.dtype, bb, m, 1);
#pragma omp simd
        for (int64_t j = 0; j < m; ++j) ab[j] += bb[j];
        from_f32(ab, elem(y, i), y.dtype, m, 1);
      }
    });
    return;
  }
  dispatch_float(a.dtype, [&](auto A) {
    using EA = decltype(A);
    dispatch_float(b.dtype, [&](auto B) {
      using EB = decltype(B);
      dispatch_float(y.dtype, [&](auto Y) {
        using EY = decltype(Y);
        const auto* pa = a.as<typename EA::storage>();
        const auto* pb = b.as<typename EB::storage>();
        auto* py = y.as<typename EY::storage>();
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
        for (int64_t i = 0; i < n; ++i) py[i] = EY::store(EA::load(pa[i]) + EB::load(pb[i]));
      });
    });
  });
}

RT_KERNEL_FAMILY(cpu, pointwise) {
  table.declare(op_name(Op::dropout), kFloatDTypes);
  table.declare(op_name(Op::add), kFloatDTypes);
  table.declare(op_name(Op::mul), kFloatDTypes);
}
}  // namespace ringtrain::kernels::cpu
