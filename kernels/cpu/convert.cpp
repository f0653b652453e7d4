// Bulk fp32 <-> fp16/bf16 conversion for the CPU backend. fp16 uses the F16C instructions
// when the CPU has them (checked once at run time; identical results to the scalar code,
// which the unit tests verify bit for bit); everything else is scalar code that GCC
// vectorises.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/elem.hpp"

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

template <typename Body>
void parallel_chunks(int64_t n, int threads, Body body) {
  constexpr int64_t kChunk = 1 << 14;
  if (threads <= 1 || n < kParallelMin) {
    body(0, n);
    return;
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t lo = c * kChunk, hi = lo + kChunk < n ? lo + kChunk : n;
    body(lo, hi);
  }
}

}  // namespace

void to_f32(const void* src, DType t, float* dst, int64_t n, int threads) {
  if (t == DType::f32) {
    if (src != dst) std::memcpy(dst, src, size_t(n) * 4);
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  parallel_chunks(n, threads, [&](int64_t lo, int64_t hi) {
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
    if (t == DType::f16 && have_f16c()) return f32_to_half_f16c(src + lo, d + lo, hi - lo);
    if (t == DType::f16) {
      for (int64_t i = lo; i < hi; ++i) d[i] = float_to_half(src[i]);
    } else {
      for (int64_t i = lo; i < hi; ++i) d[i] = float_to_bf16(src[i]);
    }
  });
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
