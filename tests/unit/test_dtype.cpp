// Unit tests of the scalar fp32 <-> fp16/bf16 conversions (core/dtype.hpp) and the bulk
// conversions of the CPU backend (kernels/cpu/elem.hpp). Every 16-bit pattern is
// round-tripped; fp32 -> 16-bit rounding is checked against two independent references:
// the F16C instruction (hardware) and a nearest-neighbour search in double arithmetic.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.hpp"
#include "kernels/cpu/elem.hpp"
#include "test_util.hpp"

namespace ringtrain {
namespace {

using test::hex;

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

bool is_half_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool is_bf16_nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

// ---- independent decoding, in double -------------------------------------------------
// Value of a positive finite pattern, from the format's definition rather than bit tricks.
double half_value(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  return e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
}
double bf16_value(uint16_t b) {
  const int e = (b >> 7) & 0xff, m = b & 0x7f;
  return e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
}

// Round-to-nearest-even reference for one 16-bit format, working on the sorted table of
// the values of its positive finite patterns 0..max_finite. `beyond` is the value the next
// pattern (the inf pattern) would have with an unbounded exponent, so values at or past
// the midpoint of max_finite and `beyond` round to inf exactly as IEEE 754 says.
class RoundRef {
 public:
  RoundRef(double (*value)(uint16_t), uint16_t max_finite, double beyond)
      : max_finite_(max_finite) {
    for (uint32_t h = 0; h <= max_finite; ++h) table_.push_back(value(uint16_t(h)));
    table_.push_back(beyond);
  }

  // The pattern for fp32 `x` (not nan): sign, then the nearer neighbour, ties to even.
  uint16_t operator()(float x) const {
    const uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
    const double a = std::fabs(double(x));
    if (std::isinf(x)) return uint16_t(sign | (max_finite_ + 1));
    if (a >= table_.back()) return uint16_t(sign | (max_finite_ + 1));  // fp16 only: >= 2^16
    const size_t lo =
        size_t(std::upper_bound(table_.begin(), table_.end(), a) - table_.begin()) - 1;
    // Both differences are exact in double: the operands have at most 24 significant bits
    // and the differences are under one 16-bit ulp, so they fit in 53 bits.
    const double below = a - table_[lo], above = table_[lo + 1] - a;
    uint32_t h = below < above ? lo : above < below ? lo + 1 : (lo & 1u) ? lo + 1 : lo;
    return uint16_t(sign | h);
  }

 private:
  uint16_t max_finite_;
  std::vector<double> table_;
};

const RoundRef& half_ref() {
  static const RoundRef r(half_value, 0x7bffu, 65536.0);
  return r;
}
const RoundRef& bf16_ref() {
  static const RoundRef r(bf16_value, 0x7f7fu, std::ldexp(1.0, 128));
  return r;
}

// ---- (a) every 16-bit pattern round-trips --------------------------------------------

TEST(DTypeHalf, AllPatternsRoundTrip) {
  int failures = 0;
  for (uint32_t h = 0; h <= 0xffffu && failures < 10; ++h) {
    const float f = half_to_float(uint16_t(h));
    const uint16_t back = float_to_half(f);
    const bool neg = (h & 0x8000u) != 0;
    if (is_half_nan(uint16_t(h))) {
      if (!std::isnan(f) || std::signbit(f) != neg || !is_half_nan(back) ||
          (back & 0x8000u) != (h & 0x8000u)) {
        ADD_FAILURE() << "nan pattern " << hex(h, 4) << " -> fp32 " << hex(bits(f)) << " -> "
                      << hex(back, 4);
        ++failures;
      }
      continue;
    }
    // The fp32 value must be the pattern's value as the format defines it.
    const double want = (neg ? -1.0 : 1.0) *
                        ((h & 0x7c00u) == 0x7c00u ? INFINITY : half_value(uint16_t(h & 0x7fffu)));
    if (double(f) != want || std::signbit(f) != neg || back != h) {
      ADD_FAILURE() << "pattern " << hex(h, 4) << " -> fp32 " << f << " (want " << want << ") -> "
                    << hex(back, 4);
      ++failures;
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(DTypeBf16, AllPatternsRoundTrip) {
  int failures = 0;
  for (uint32_t b = 0; b <= 0xffffu && failures < 10; ++b) {
    const float f = bf16_to_float(uint16_t(b));
    const uint16_t back = float_to_bf16(f);
    const bool neg = (b & 0x8000u) != 0;
    if (is_bf16_nan(uint16_t(b))) {
      if (!std::isnan(f) || std::signbit(f) != neg || !is_bf16_nan(back) ||
          (back & 0x8000u) != (b & 0x8000u)) {
        ADD_FAILURE() << "nan pattern " << hex(b, 4) << " -> fp32 " << hex(bits(f)) << " -> "
                      << hex(back, 4);
        ++failures;
      }
      continue;
    }
    const double want = (neg ? -1.0 : 1.0) *
                        ((b & 0x7f80u) == 0x7f80u ? INFINITY : bf16_value(uint16_t(b & 0x7fffu)));
    if (double(f) != want || std::signbit(f) != neg || back != b) {
      ADD_FAILURE() << "pattern " << hex(b, 4) << " -> fp32 " << f << " (want " << want << ") -> "
                    << hex(back, 4);
      ++failures;
    }
  }
  EXPECT_EQ(failures, 0);
}

// ---- (b) fp32 -> fp16 against the F16C instruction -----------------------------------

__attribute__((target("f16c"))) void f16c_from_f32(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128i h = _mm_cvtps_ph(_mm_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i)
    dst[i] =
        uint16_t(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(src[i]), _MM_FROUND_TO_NEAREST_INT), 0));
}

// The fp32 patterns of the sweep: a stride over all 2^32 patterns, then dense ranges
// where the rounding has special cases (both signs of each).
std::vector<uint32_t> f16_sweep_patterns() {
  std::vector<uint32_t> p;
  p.reserve(6'000'000);
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4099) p.push_back(uint32_t(u));
  auto dense = [&](uint32_t lo, uint32_t hi) {  // [lo, hi], positive and negative
    for (uint32_t u = lo; u <= hi; ++u) {
      p.push_back(u);
      p.push_back(u | 0x80000000u);
    }
  };
  dense(0x38800000u - (1u << 20), 0x38800000u + (1u << 20));  // subnormal/normal boundary
  dense(0x33000000u - (1u << 16), 0x33000000u + (1u << 16));  // half the smallest subnormal
  dense(0x33800000u - (1u << 14), 0x33c00000u + (1u << 14));  // smallest subnormals
  dense(0x477fe000u - (1u << 12), 0x47800000u + (1u << 12));  // 65504 .. 65536 and past it
  dense(0x7f7ff000u, 0x7f800010u);                            // FLT_MAX, inf, first nans
  dense(0x7fbffff0u, 0x7fc00010u);                            // signalling/quiet nan edge
  dense(0x00000000u, 0x00001000u);                            // fp32 zero and subnormals
  // Every exact tie between two consecutive finite halves (and 65520, the overflow
  // threshold), with its fp32 neighbours on both sides.
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const double mid =
        h == 0x7bffu ? 65520.0 : (half_value(uint16_t(h)) + half_value(uint16_t(h + 1))) / 2;
    const uint32_t t = bits(float(mid));
    for (uint32_t u = t - 2; u <= t + 2; ++u) {
      p.push_back(u);
      p.push_back(u | 0x80000000u);
    }
  }
  return p;
}

// Compares float_to_half with F16C on n patterns; counts (and reports up to 10) mismatches.
void compare_with_f16c(const uint32_t* pats, size_t n, int& failures) {
  std::vector<float> in(n);
  for (size_t i = 0; i < n; ++i) in[i] = from_bits(pats[i]);
  std::vector<uint16_t> hw(n);
  f16c_from_f32(in.data(), hw.data(), n);
  for (size_t i = 0; i < n; ++i) {
    const uint16_t got = float_to_half(in[i]);
    if (got != hw[i] && ++failures <= 10)
      ADD_FAILURE() << "fp32 " << hex(pats[i]) << " (" << in[i] << "): float_to_half gives "
                    << hex(got, 4) << ", F16C gives " << hex(hw[i], 4);
  }
}

TEST(DTypeHalf, RoundingMatchesF16C) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "this CPU has no F16C instructions";
  int failures = 0;
  const std::vector<uint32_t> pats = f16_sweep_patterns();
  compare_with_f16c(pats.data(), pats.size(), failures);
  // Exhaustively, every positive fp32 value that rounds into the fp16 subnormals (the
  // shift-and-round branch of float_to_half), in chunks.
  std::vector<uint32_t> chunk(1 << 20);
  for (uint32_t lo = 0x33000000u; lo < 0x38800000u; lo += uint32_t(chunk.size())) {
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = lo + uint32_t(i);
    compare_with_f16c(chunk.data(), chunk.size(), failures);
  }
  // The normal range up to overflow with stride 7, odd so every value of the 13 bits that
  // are rounded away comes up.
  for (uint32_t lo = 0x38800000u; lo < 0x47800000u; lo += 7 * uint32_t(chunk.size())) {
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = lo + 7 * uint32_t(i);
    compare_with_f16c(chunk.data(), chunk.size(), failures);
  }
  EXPECT_EQ(failures, 0);
}

// ---- (c) fp32 -> fp16 / bf16 against the double-arithmetic reference -----------------

// Random bit patterns, random values in the format's interesting exponent range, and edges.
std::vector<uint32_t> random_patterns(uint32_t seed, int exp_lo, int exp_hi) {
  std::mt19937 gen(seed);
  std::vector<uint32_t> p;
  for (int i = 0; i < 1'500'000; ++i) p.push_back(uint32_t(gen()));
  std::uniform_int_distribution<int> exp(exp_lo, exp_hi);
  for (int i = 0; i < 1'500'000; ++i) {
    const uint32_t sign = gen() & 0x80000000u, e = uint32_t(exp(gen));
    p.push_back(sign | (e << 23) | (gen() & 0x7fffffu));
  }
  for (uint32_t u :
       {0x00000000u, 0x00000001u, 0x007fffffu, 0x00800000u, 0x33000000u, 0x33000001u, 0x337fffffu,
        0x33800000u, 0x387fe000u, 0x387ff000u, 0x387fffffu, 0x38800000u, 0x3f800000u, 0x3f801000u,
        0x3f803000u, 0x3f808000u, 0x3f818000u, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u,
        0x47800000u, 0x7f7f0000u, 0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu, 0x7f800000u}) {
    p.push_back(u);
    p.push_back(u | 0x80000000u);
  }
  return p;
}

template <typename Convert, typename IsNan>
void check_against_ref(const std::vector<uint32_t>& pats, Convert convert, const RoundRef& ref,
                       IsNan is_nan, const char* fmt) {
  int failures = 0;
  for (size_t i = 0; i < pats.size() && failures < 10; ++i) {
    const float x = from_bits(pats[i]);
    const uint16_t got = convert(x);
    if (std::isnan(x)) {
      if (!is_nan(got) || bool(got & 0x8000u) != std::signbit(x)) {
        ADD_FAILURE() << "fp32 nan " << hex(pats[i]) << " -> " << fmt << " " << hex(got, 4);
        ++failures;
      }
      continue;
    }
    const uint16_t want = ref(x);
    if (got != want) {
      ADD_FAILURE() << "fp32 " << hex(pats[i]) << " (" << x << ") -> " << fmt << " " << hex(got, 4)
                    << ", reference " << hex(want, 4);
      ++failures;
    }
  }
  EXPECT_EQ(failures, 0) << "of " << pats.size() << " patterns";
}

TEST(DTypeHalf, RoundingMatchesDoubleReference) {
  // fp32 exponents 100..145 span everything from below half the smallest fp16 subnormal
  // to past fp16 overflow.
  check_against_ref(random_patterns(1, 100, 145), float_to_half, half_ref(), is_half_nan, "fp16");
}

TEST(DTypeBf16, RoundingMatchesDoubleReference) {
  std::vector<uint32_t> pats = random_patterns(2, 0, 254);
  // Exact ties and their neighbours at a few thousand random places.
  std::mt19937 gen(3);
  for (int i = 0; i < 4000; ++i) {
    const uint32_t hi = gen() & 0xffff0000u;
    for (uint32_t lo : {0x7fffu, 0x8000u, 0x8001u}) pats.push_back(hi | lo);
  }
  check_against_ref(pats, float_to_bf16, bf16_ref(), is_bf16_nan, "bf16");
}

// ---- (d) bulk conversions equal the scalar ones, bit for bit -------------------------

class BulkConvert : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(BulkConvert, FromF32MatchesScalar) {
  const auto [dt, threads] = GetParam();
  // 100'003 elements: several parallel chunks and a tail that is not a multiple of 8.
  for (int64_t n : {int64_t(13), int64_t(100'003)}) {
    std::mt19937 gen{uint32_t(n)};
    std::vector<float> src(static_cast<size_t>(n));
    for (auto& x : src) {
      // Half the values near the format's range, half arbitrary patterns (inf, nan, ...).
      x = gen() & 1 ? from_bits(gen())
                    : std::ldexp(float(int32_t(gen())) * 0x1p-31f, int(gen() % 48) - 28);
    }
    std::vector<uint16_t> dst(static_cast<size_t>(n), 0xdeadu);
    kernels::cpu::from_f32(src.data(), dst.data(), dt, n, threads);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = dt == DType::f16 ? float_to_half(src[i]) : float_to_bf16(src[i]);
      ASSERT_EQ(hex(want, 4), hex(dst[size_t(i)], 4))
          << "at index " << i << " of " << n << ", fp32 " << hex(bits(src[i]));
    }
  }
}

TEST_P(BulkConvert, ToF32MatchesScalar) {
  const auto [dt, threads] = GetParam();
  // All 65,536 patterns plus 3 (a tail that is not a multiple of 8), and a short vector.
  for (int64_t n : {int64_t(11), int64_t(65'539)}) {
    std::vector<uint16_t> src(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) src[size_t(i)] = uint16_t(i * (n == 11 ? 6007 : 1));
    std::vector<float> dst(static_cast<size_t>(n), -1.f);
    kernels::cpu::to_f32(src.data(), dt, dst.data(), n, threads);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t s = src[size_t(i)];
      const float want = dt == DType::f16 ? half_to_float(s) : bf16_to_float(s);
      ASSERT_EQ(hex(bits(want)), hex(bits(dst[size_t(i)])))
          << "at index " << i << " of " << n << ", 16-bit pattern " << hex(s, 4);
    }
  }
}

TEST(BulkConvert, ToF32SignallingNanBitExact) {
  // fp16 0x7c01 is a signalling nan; the scalar and the F16C path should give the same bits.
  std::vector<uint16_t> src(16, 0x7c01u);
  std::vector<float> dst(16);
  kernels::cpu::to_f32(src.data(), DType::f16, dst.data(), 16, 1);
  EXPECT_EQ(hex(bits(half_to_float(0x7c01u))), hex(bits(dst[0])));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BulkConvert,
                         ::testing::Combine(::testing::Values(DType::f16, DType::bf16),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_threads" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---- names and parsing ---------------------------------------------------------------

TEST(DType, SizesNamesAndParsing) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_EQ(parse_float_dtype("half", "--precision"), DType::f16);
  EXPECT_EQ(parse_float_dtype("bfloat16", "--precision"), DType::bf16);
  EXPECT_EQ(parse_float_dtype("float32", "--precision"), DType::f32);
  EXPECT_TRUE(
      test::throws_kind([] { parse_float_dtype("int8", "--precision"); }, ErrorKind::input));
}

}  // namespace
}  // namespace ringtrain
