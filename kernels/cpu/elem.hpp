// Typed element access for the CPU kernels: Elem<DType> says how one element of each float
// dtype is stored, loaded to fp32 and stored from fp32; dispatch_float() picks the Elem for a
// runtime dtype once per kernel, so the inner loops are monomorphic and vectorise.
// Also the bulk fp32 <-> fp16/bf16 conversions (F16C when the CPU has it).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "core/dtype.hpp"
#include "core/error.hpp"

namespace ringtrain::kernels::cpu {

template <DType T>
struct Elem;
template <>
struct Elem<DType::f32> {
  using storage = float;
  static float load(float v) { return v; }
  static float store(float f) { return f; }
};
template <>
struct Elem<DType::f16> {
  using storage = uint16_t;
  static float load(uint16_t v) { return half_to_float(v); }
  static uint16_t store(float f) { return float_to_half(f); }
};
template <>
struct Elem<DType::bf16> {
  using storage = uint16_t;
  static float load(uint16_t v) { return bf16_to_float(v); }
  // float_to_bf16's result, written as a select rather than an early return for a nan, so
  // that the loops storing bf16 vectorise.
  static uint16_t store(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const uint32_t quiet_nan = (x >> 16) | 0x40u;
    const uint32_t nearest = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // ties to even
    return uint16_t((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : nearest);
  }
};

template <typename F>
decltype(auto) dispatch_float(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(Elem<DType::f32>{});
    case DType::f16:
      return f(Elem<DType::f16>{});
    case DType::bf16:
      return f(Elem<DType::bf16>{});
    default:
      break;
  }
  throw_runtime(__FILE__, __LINE__, cat("a float dtype was expected, got ", dtype_name(t)));
}

// Element ranges below this size stay on one thread: the fork/join costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;

// body(lo, hi) over [0, n): in chunks of 16 Ki elements on `threads` threads, or in one call
// when single-threaded or small.
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

// dst[i] = float(src[i]) for n elements of dtype t; threads <= 1 runs serially.
void to_f32(const void* src, DType t, float* dst, int64_t n, int threads);
// dst[i] = round_nearest_even(src[i]) into dtype t.
void from_f32(const float* src, void* dst, DType t, int64_t n, int threads);
// Which fp32 -> bf16 code from_f32 runs on this CPU: "avx512_bf16" (VCVTNE2PS2BF16),
// "avx512f" (integer rounding, 16 lanes) or "scalar".
const char* bf16_conversion_path();

}  // namespace ringtrain::kernels::cpu
