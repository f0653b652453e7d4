// Fletcher32 as HDF5 computes it, vectorised. Written here rather than taken from HDF5 for
// speed and control: HDF5's own (H5_checksum_fletcher32) is a scalar loop of about 2 GB/s
// that it runs inside its filter pipeline after copying each chunk into a fresh buffer, and
// H5Zregister refuses to replace a predefined filter ("unable to modify predefined
// filters"). The unit test checks every value against HDF5's function.
//
// The sums: with words w_1..w_n, HDF5's sum1 is Σ w_j and its sum2 Σ (n - j + 1) w_j, both
// folded modulo 65535 in a way that gives 0 only when every word is 0 and 65535 for the other
// multiples of 65535. A block of words contributes its plain sum and its position-weighted
// sum; both fit 32-bit lanes for blocks of kBlockWords words.
#include "io/fletcher32.hpp"

#include <immintrin.h>

#include <algorithm>

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized
// reports as a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ringtrain::io {
namespace {

constexpr uint64_t kMod = 65535;
constexpr size_t kBlockWords = 2048;

struct Sums {
  uint64_t sum;       // Σ w_j over the block's n words
  uint64_t weighted;  // Σ (n - j) w_j, j = 0..n-1
};

uint32_t word(const unsigned char* p) { return (uint32_t(p[0]) << 8) | p[1]; }

Sums block_scalar(const unsigned char* p, size_t n) {
  uint64_t a = 0, b = 0;
  for (size_t j = 0; j < n; ++j) {
    const uint32_t x = word(p + 2 * j);
    a += x;
    b += uint64_t(n - j) * x;
  }
  return {a, b};
}

// L lanes; lane l sums the words L k + l. v2 adds the running v1 before each group, so after
// K groups Σ (L K - j) w_j = L Σ v2 + Σ (L - l) v1. Then the words left over (fewer than a
// vector) follow, adding their count to every earlier word's weight.
template <int L>
Sums combine(const uint32_t* v1, const uint32_t* v2, const unsigned char* p, size_t n,
             size_t done) {
  uint64_t sum = 0, weighted = 0;
  for (int l = 0; l < L; ++l) {
    sum += v1[l];
    weighted += uint64_t(L) * v2[l] + uint64_t(L - l) * v1[l];
  }
  const Sums tail = block_scalar(p + 2 * done, n - done);
  return {sum + tail.sum, weighted + (n - done) * sum + tail.weighted};
}

__attribute__((target("avx512f,avx512bw"))) Sums block_avx512(const unsigned char* p, size_t n) {
  const __m512i swap = _mm512_set4_epi32(0x0e0f0c0d, 0x0a0b0809, 0x06070405, 0x02030001);
  __m512i v1 = _mm512_setzero_si512(), v2 = _mm512_setzero_si512();
  const size_t vecs = n / 32;  // 64 bytes: two groups of 16 words
  for (size_t i = 0; i < vecs; ++i) {
    const __m512i x = _mm512_shuffle_epi8(_mm512_loadu_si512(p + 64 * i), swap);
    v2 = _mm512_add_epi32(v2, v1);
    v1 = _mm512_add_epi32(v1, _mm512_cvtepu16_epi32(_mm512_castsi512_si256(x)));
    v2 = _mm512_add_epi32(v2, v1);
    v1 = _mm512_add_epi32(v1, _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(x, 1)));
  }
  alignas(64) uint32_t a1[16], a2[16];
  _mm512_store_si512(a1, v1);
  _mm512_store_si512(a2, v2);
  return combine<16>(a1, a2, p, n, vecs * 32);
}

__attribute__((target("avx2"))) Sums block_avx2(const unsigned char* p, size_t n) {
  const __m256i swap = _mm256_set_epi8(14, 15, 12, 13, 10, 11, 8, 9, 6, 7, 4, 5, 2, 3, 0, 1, 14, 15,
                                       12, 13, 10, 11, 8, 9, 6, 7, 4, 5, 2, 3, 0, 1);
  __m256i v1 = _mm256_setzero_si256(), v2 = _mm256_setzero_si256();
  const size_t vecs = n / 16;  // 32 bytes: two groups of 8 words
  for (size_t i = 0; i < vecs; ++i) {
    const __m256i x =
        _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * i)), swap);
    v2 = _mm256_add_epi32(v2, v1);
    v1 = _mm256_add_epi32(v1, _mm256_cvtepu16_epi32(_mm256_castsi256_si128(x)));
    v2 = _mm256_add_epi32(v2, v1);
    v1 = _mm256_add_epi32(v1, _mm256_cvtepu16_epi32(_mm256_extracti128_si256(x, 1)));
  }
  alignas(32) uint32_t a1[8], a2[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a1), v1);
  _mm256_store_si256(reinterpret_cast<__m256i*>(a2), v2);
  return combine<8>(a1, a2, p, n, vecs * 16);
}

using BlockFn = Sums (*)(const unsigned char*, size_t);

BlockFn block_fn(Fletcher32Isa isa) {
  if (isa == Fletcher32Isa::avx512 && __builtin_cpu_supports("avx512bw")) return block_avx512;
  if (isa >= Fletcher32Isa::avx2 && __builtin_cpu_supports("avx2")) return block_avx2;
  return block_scalar;
}

uint32_t checksum(const unsigned char* p, size_t len, BlockFn block) {
  const size_t words = len / 2;
  uint64_t s1 = 0, s2 = 0;
  bool nonzero = false;
  for (size_t i = 0; i < words; i += kBlockWords) {
    const size_t n = std::min(kBlockWords, words - i);
    const Sums s = block(p + 2 * i, n);
    nonzero |= s.sum != 0;
    s2 = (s2 + n * s1 + s.weighted) % kMod;
    s1 = (s1 + s.sum) % kMod;
  }
  if (len % 2) {
    const uint64_t x = uint64_t(p[len - 1]) << 8;
    nonzero |= x != 0;
    s1 = (s1 + x) % kMod;
    s2 = (s2 + s1) % kMod;
  }
  if (!nonzero) return 0;
  const uint64_t r1 = s1 == 0 ? kMod : s1, r2 = s2 == 0 ? kMod : s2;
  return uint32_t((r2 << 16) | r1);
}

}  // namespace

uint32_t fletcher32(const void* data, size_t len) {
  static const BlockFn block = block_fn(Fletcher32Isa::avx512);
  return checksum(static_cast<const unsigned char*>(data), len, block);
}

uint32_t fletcher32(const void* data, size_t len, Fletcher32Isa isa) {
  return checksum(static_cast<const unsigned char*>(data), len, block_fn(isa));
}

}  // namespace ringtrain::io
