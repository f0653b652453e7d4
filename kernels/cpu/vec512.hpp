// AVX-512 building blocks for the CPU's one-pass pointwise kernels (GELU, add, the loss
// scaler's unscale_check): 16 lanes of any float dtype loaded as fp32 and stored back with the
// scalar code's rounding (core/dtype.hpp: nearest-even, nan quieted), so a 16-bit tensor is
// widened and rounded in registers instead of in a separate pass over a block; and
// e^x / sigmoid for fp32 lanes. Only for functions compiled with RT_AVX512_TARGET
// (vec_math.hpp), called when use_avx512() says the CPU has it. The attention's softmax
// (attention_tiles.cpp) uses exp() and tail_mask() too.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <tuple>

#include "core/tensor.hpp"
#include "kernels/cpu/elem.hpp"
#include "kernels/cpu/vec_math.hpp"

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized
// reports (a known false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ringtrain::kernels::cpu::v512 {

#define RT_V512 RT_AVX512_TARGET inline __attribute__((always_inline))

// Lanes [i, i + 16) of p (dtype t) as fp32; lanes outside `m` read nothing and are 0.
RT_V512 __m512 load(const void* p, DType t, int64_t i, __mmask16 m) {
  if (t == DType::f32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
  if (t == DType::f16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));  // bf16: exact
}

// True when the CPU has AVX512-BF16 too (VCVTNEPS2BF16) besides use_avx512().
inline bool use_avx512_bf16() {
  static const bool yes = use_avx512() && __builtin_cpu_supports("avx512bf16");
  return yes;
}

// Stores the lanes in `m` of v to [i, i + 16) of p (dtype t), rounded as the scalar
// float_to_half / float_to_bf16 round. kNativeBf16 (only where use_avx512_bf16()): bf16 by
// VCVTNEPS2BF16, one instruction for the integer rounding's ten, unless a lane is a
// denormal, which it would read as zero. Written as inline assembly so that the kernels
// calling this need no AVX512-BF16 target of their own (their other instantiation must
// run on AVX-512 CPUs without it).
template <bool kNativeBf16 = false>
RT_V512 void store(void* p, DType t, int64_t i, __mmask16 m, __m512 v) {
  if (t == DType::f32) return _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, v);
  __m256i h;
  if (kNativeBf16 && t == DType::bf16 && !_mm512_mask_fpclass_ps_mask(m, v, 0x20)) {  // denormal
    asm("vcvtneps2bf16 %1, %0" : "=v"(h) : "v"(v));
  } else if (t == DType::f16) {
    h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  } else {  // bf16: nearest, ties to even, in integer arithmetic (exact for denormals too)
    const __m512i x = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(x, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    h = _mm512_cvtepi32_epi16(r);
  }
  _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m, h);
}

// The lanes of [i, n) among the next 16.
inline __mmask16 tail_mask(int64_t i, int64_t n) {
  return n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1u);
}

// e^x with exp_fast's clamp to [-87.3, 88] and its Cephes polynomial; 2^n applied by
// VSCALEFPS, which needs no split of n into two factors.
RT_V512 __m512 exp(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// 1 / (1 + e^-t): VRCP14PS (relative error < 2^-14) and one Newton step, which leaves about
// 2^-23 and costs two FMA-unit instructions where a VDIVPS blocks the divider for ten cycles.
// The clamp in exp() keeps 1 + e^-t finite, so the Newton step never meets inf * 0.
RT_V512 __m512 sigmoid(__m512 t) {
  const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.f), exp(_mm512_sub_ps(_mm512_setzero_ps(), t)));
  const __m512 r = _mm512_rcp14_ps(d);
  return _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.f)));
}

#undef RT_V512

// A kernel template K<T> instantiated for each float dtype T (all its tensors of dtype T,
// known at compile time) and for DType::i32 (any mix of float dtypes, tested in the loop):
// dtype<T>(t) is the dtype a kernel uses for tensor t.
template <DType T>
constexpr bool fixed = T == DType::f32 || T == DType::f16 || T == DType::bf16;
template <DType T>
DType dtype(const Tensor& t) {
  return fixed<T> ? T : t.dtype;
}

// K<T, kNativeBf16>{}(ts..., lo, hi) over [0, n) on `threads` threads, T the dtype all `ts`
// share, or the generic instantiation when they differ; kNativeBf16 (for store()) where the
// CPU has it and a tensor may be bf16.
template <template <DType, bool> class K, typename... Ts>
void run(int64_t n, int threads, const Ts&... ts) {
  const DType t0 = std::get<0>(std::tie(ts...)).dtype;
  const bool same = ((ts.dtype == t0) && ...);
  const auto go = [&](auto kernel) {
    parallel_chunks(n, threads, [&](int64_t lo, int64_t hi) { kernel(ts..., lo, hi); });
  };
  const bool native = use_avx512_bf16();
  if (same && t0 == DType::f32) return go(K<DType::f32, false>{});
  if (same && t0 == DType::bf16)
    return native ? go(K<DType::bf16, true>{}) : go(K<DType::bf16, false>{});
  if (same && t0 == DType::f16) return go(K<DType::f16, false>{});
  native ? go(K<DType::i32, true>{}) : go(K<DType::i32, false>{});
}

}  // namespace ringtrain::kernels::cpu::v512

#pragma GCC diagnostic pop
