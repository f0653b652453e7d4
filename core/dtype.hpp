// DType (f32, f16, bf16, i32, i64, u8, f64) and the scalar conversions between fp32 and the
// 16-bit float formats, rounding to nearest even like the hardware does.
// Bulk conversions over buffers live in kernels (kernels::Backend::cast).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ringtrain {

// f64 is for host-side reductions (metrics, norms), not a compute dtype.
enum class DType { f32, f16, bf16, i32, i64, u8, f64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "fp32", "fp16", "bf16", "int32", "int64", "uint8"
bool is_float(DType t);
// Parses fp32|fp16|bf16 (also f32/float32, f16/float16/half, bfloat16); input error otherwise,
// naming `what` (e.g. "--precision").
DType parse_float_dtype(std::string_view s, std::string_view what);

// ---- IEEE binary16 ----------------------------------------------------------------
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf / nan: keep the payload, quiet a signalling nan (as F16C does)
    bits = sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0u);
  } else if (exp != 0) {  // normal
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {  // zero
    bits = sign;
  } else {                                   // subnormal: normalise
    int shift = std::countl_zero(man) - 21;  // leading zeros within 10 bits
    man = (man << shift) & 0x3ffu;
    bits = sign | (uint32_t(113 - shift) << 23) | (man << 13);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or nan; nan stays a (quiet) nan
    return ax > 0x7f800000u ? uint16_t(sign | 0x7e00u | ((ax >> 13) & 0x3ffu))
                            : uint16_t(sign | 0x7c00u);
  }
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (ax >= 0x38800000u) {                                 // normal half
    const uint32_t round = 0xfffu + ((ax >> 13) & 1u);     // nearest, ties to even
    return uint16_t(sign | ((ax - 0x38000000u + round) >> 13));
  }
  if (ax < 0x33000000u) return sign;  // below half of the smallest subnormal: zero
  // Subnormal half: shift the full significand right, rounding to nearest even.
  const uint32_t e = ax >> 23;
  const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t r = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return uint16_t(sign | r);
}

// ---- bfloat16 -----------------------------------------------------------------------
inline float bf16_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet nan
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);                  // nearest, ties to even
}

}  // namespace ringtrain
