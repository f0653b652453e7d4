// Bulk fp32 <-> fp16/bf16 conversion for the CPU backend, chosen once at run time by what
// the CPU has: AVX512-BF16's VCVTNE2PS2BF16 (32 lanes, fp32 -> bf16), AVX-512F (16 lanes,
// fp16 and bf16), else F16C (8 lanes, fp16), else portable scalar code. Every path gives the
// scalar code's bits (core/dtype.hpp), which the unit tests verify: VCVTNE2PS2BF16 treats
// denormal inputs as zero, so a block holding one is converted in integer arithmetic
// instead (denormals are rare in training data, so the native instruction does the bulk).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/elem.hpp"

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized
// reports (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ringtrain::kernels::cpu {
namespace {

bool have_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return yes;
}

__attribute__((target("avx,f16c"))) void half_to_f32_f16c(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = half_to_float(s[i]);
}

__attribute__((target("avx,f16c"))) void f32_to_half_f16c(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) d[i] = float_to_half(s[i]);
}

bool have_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

__attribute__((target("avx512f"))) void half_to_f32_avx512(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i,
                     _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
  for (; i < n; ++i) d[i] = half_to_float(s[i]);
}

__attribute__((target("avx512f"))) void f32_to_half_avx512(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) d[i] = float_to_half(s[i]);
}

__attribute__((target("avx512f"))) void bf16_to_f32_avx512(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i w =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    _mm512_storeu_si512(d + i, _mm512_slli_epi32(w, 16));
  }
  for (; i < n; ++i) d[i] = bf16_to_float(s[i]);
}

// float_to_bf16 of core/dtype.hpp, 16 lanes at a time: nearest, ties to even; nan quieted.
__attribute__((target("avx512f"))) void f32_to_bf16_avx512(const float* s, uint16_t* d, int64_t n) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff),
                abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000),
                quiet = _mm512_set1_epi32(0x40);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i x = _mm512_loadu_si512(s + i);
    const __m512i hi = _mm512_srli_epi32(x, 16);
    const __m512i lsb = _mm512_and_si512(hi, one);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, bias), lsb), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, abs_mask), inf);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm512_cvtepi32_epi16(r));
  }
  for (; i < n; ++i) d[i] = float_to_bf16(s[i]);
}

bool have_avx512_bf16() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512bf16");
  return yes;
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) void f32_to_bf16_native(const float* s,
                                                                               uint16_t* d,
                                                                               int64_t n) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000), man_mask = _mm512_set1_epi32(0x007fffff);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(s + i), hi = _mm512_loadu_ps(s + i + 16);
    // Denormal lanes: exponent zero, mantissa not.
    const __m512i lb = _mm512_castps_si512(lo), hb = _mm512_castps_si512(hi);
    const __mmask16 den_lo = _mm512_testn_epi32_mask(lb, exp_mask) &
                             _mm512_test_epi32_mask(lb, man_mask),
                    den_hi = _mm512_testn_epi32_mask(hb, exp_mask) &
                             _mm512_test_epi32_mask(hb, man_mask);
    if (den_lo | den_hi) {
      f32_to_bf16_avx512(s + i, d + i, 32);
      continue;
    }
    _mm512_storeu_si512(d + i, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
  f32_to_bf16_avx512(s + i, d + i, n - i);
}

}  // namespace

void to_f32(const void* src, DType t, float* dst, int64_t n, int threads) {
  if (t == DType::f32) {
    if (src != dst) std::memcpy(dst, src, size_t(n) * 4);
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  parallel_chunks(n, threads, [&](int64_t lo, int64_t hi) {
    if (have_avx512())
      return t == DType::f16 ? half_to_f32_avx512(s + lo, dst + lo, hi - lo)
                             : bf16_to_f32_avx512(s + lo, dst + lo, hi - lo);
    if (t == DType::f16 && have_f16c()) return half_to_f32_f16c(s + lo, dst + lo, hi - lo);
    if (t == DType::f16) {
      for (int64_t i = lo; i < hi; ++i) dst[i] = half_to_float(s[i]);
    } else {
      for (int64_t i = lo; i < hi; ++i) dst[i] = bf16_to_float(s[i]);
    }
  });
}

void from_f32(const float* src, void* dst, DType t, int64_t n, int threads) {
  if (t == DType::f32) {
    if (src != dst) std::memcpy(dst, src, size_t(n) * 4);
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  parallel_chunks(n, threads, [&](int64_t lo, int64_t hi) {
    if (t == DType::bf16 && have_avx512_bf16())
      return f32_to_bf16_native(src + lo, d + lo, hi - lo);
    if (have_avx512())
      return t == DType::f16 ? f32_to_half_avx512(src + lo, d + lo, hi - lo)
                             : f32_to_bf16_avx512(src + lo, d + lo, hi - lo);
    if (t == DType::f16 && have_f16c()) return f32_to_half_f16c(src + lo, d + lo, hi - lo);
    if (t == DType::f16) {
      for (int64_t i = lo; i < hi; ++i) d[i] = float_to_half(src[i]);
    } else {
      for (int64_t i = lo; i < hi; ++i) d[i] = float_to_bf16(src[i]);
    }
  });
}

const char* bf16_conversion_path() {
  if (have_avx512_bf16()) return "avx512_bf16";
  if (have_avx512()) return "avx512f";
  return "scalar";
}

}  // namespace ringtrain::kernels::cpu

namespace ringtrain::kernels {

void host_to_f32(const void* src, DType t, float* dst, int64_t n) {
  cpu::to_f32(src, t, dst, n, 1);
}
void host_from_f32(const float* src, void* dst, DType t, int64_t n) {
  cpu::from_f32(src, dst, t, n, 1);
}

}  // namespace ringtrain::kernels
