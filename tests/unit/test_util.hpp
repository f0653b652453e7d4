// Helpers shared by the unit tests (tests/unit/test_*.cpp): hex formatting of bit
// patterns, seeded random fills, a tolerance check that names the index, the check that a
// call throws ringtrain::Error of a given kind, and the message of an input error.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/error.hpp"

namespace ringtrain {

// Readable test parameters: "fp16" instead of a byte dump (found by argument lookup).
inline void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }

}  // namespace ringtrain

namespace ringtrain::test {

inline std::string hex(uint32_t v, int digits = 8) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", digits, v);
  return buf;
}

// n floats uniform in [lo, hi), from a fixed seed (std::mt19937 is fully specified).
inline std::vector<float> uniform_floats(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// |got - want| <= atol + rtol * |want|: the usual mixed tolerance for gradient checks.
inline bool close(double got, double want, double rtol, double atol) {
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

// Passes when f() throws ringtrain::Error of `kind`; names what happened otherwise.
template <typename F>
::testing::AssertionResult throws_kind(F&& f, ErrorKind kind) {
  try {
    f();
  } catch (const Error& e) {
    if (e.kind() == kind) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "threw ringtrain::Error of the other kind: " << e.what();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-ringtrain exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// The message of the input error fn throws (a test failure if it throws none, or another
// kind).
template <typename F>
std::string input_error(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

}  // namespace ringtrain::test

// EXPECT_HAS(text, part): text contains part (both printed when it does not).
#define EXPECT_HAS(text, part)                               \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "missing '" << (part) << "' in: " << (text)
