// Vectorisable math for the CPU transformer kernels (attention, softmax, GELU): exp
// written as plain arithmetic on floats and their bits, so the compiler turns a loop over them
// into SIMD code (glibc's expf is a call per element unless -ffast-math), and the AVX-512
// dispatch used by those kernels. Accuracy: exp within 2 ulp over the clamped range (Cephes'
// expf polynomial), enough for fp32 parity with PyTorch at 1e-5.
#pragma once

#include <bit>
#include <cstdint>

#include "kernels/cpu/cpu_features.hpp"

namespace ringtrain::kernels::cpu {

// A kernel body compiled twice: for the baseline x86-64 and for AVX-512 (chosen at run time).
#define RT_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define RT_INLINE inline __attribute__((always_inline))

// True when the AVX-512 variants may run on this CPU (F + BW + VL, the OS saving the state).
inline bool use_avx512() {
  static const bool yes = isa_level(host_features()) == IsaLevel::avx512;
  return yes;
}

// e^x for x in [-87.3, 88] (clamped outside: tiny or huge, never inf or 0/0).
RT_INLINE float exp_fast(float x) {
  x = x < -87.33654f ? -87.33654f : (x > 88.f ? 88.f : x);
  // x = n ln2 + r, |r| <= ln2/2; n rounded to nearest by the 1.5 * 2^23 trick.
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  // 2^n through the exponent bits; n in [-126, 128]: split so that neither factor overflows.
  const int32_t ni = int32_t(n);
  const int32_t n1 = ni / 2, n2 = ni - n1;
  const float s1 = std::bit_cast<float>(uint32_t(n1 + 127) << 23);
  const float s2 = std::bit_cast<float>(uint32_t(n2 + 127) << 23);
  return p * s1 * s2;
}

}  // namespace ringtrain::kernels::cpu
