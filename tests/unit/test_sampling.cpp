// Next-token sampling: top-k 1 is the argmax; top-k k never leaves the k largest logits;
// the draw frequencies over 40,000 draws match softmax(logits / T) within 5 standard
// deviations (a fixed seed: the test is deterministic); the same seed gives the same tokens;
// bad options are input errors naming the option.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "nn/sampling.hpp"
#include "test_util.hpp"

namespace ringtrain {
namespace {

TEST(Sampling, TopOneIsTheArgmaxAndTopKStaysInTheKLargest) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 2.9f, 3.0f, 1.0f};
  Rng rng(1);
  for (int i = 0; i < 100; ++i)
    ASSERT_EQ(sample_token(logits.data(), 6, 5.0, 1, rng), 1) << "ties go to the lower index";
  std::vector<int> seen(6, 0);
  for (int i = 0; i < 3000; ++i) ++seen[size_t(sample_token(logits.data(), 6, 10.0, 3, rng))];
  EXPECT_EQ(seen[0] + seen[2] + seen[5], 0) << "only tokens 1, 4 and 3 are in the top 3";
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[3], 0);
  EXPECT_GT(seen[4], 0);
}

TEST(Sampling, FrequenciesFollowTheTemperedSoftmax) {
  const std::vector<float> logits = {1.0f, 0.0f, -0.5f, 2.0f};
  for (double temperature : {1.0, 0.5, 2.0}) {
    std::vector<double> p(4);
    double sum = 0;
    for (size_t i = 0; i < 4; ++i) sum += p[i] = std::exp(logits[i] / temperature);
    Rng rng(42);
    const int n = 40000;
    std::vector<int> count(4, 0);
    for (int i = 0; i < n; ++i)
      ++count[size_t(sample_token(logits.data(), 4, temperature, 0, rng))];
    for (size_t i = 0; i < 4; ++i) {
      const double q = p[i] / sum, sd = std::sqrt(n * q * (1 - q));
      EXPECT_NEAR(count[i], n * q, 5 * sd) << "token " << i << " at temperature " << temperature;
    }
  }
}

TEST(Sampling, SameSeedSameTokensAndBadOptionsAreInputErrors) {
  const std::vector<float> logits = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  Rng a(7), b(7);
  for (int i = 0; i < 50; ++i)
    ASSERT_EQ(sample_token(logits.data(), 5, 1.0, 0, a), sample_token(logits.data(), 5, 1.0, 0, b));
  Rng r(1);
  EXPECT_TRUE(
      test::throws_kind([&] { sample_token(logits.data(), 5, 0.0, 0, r); }, ErrorKind::input));
  EXPECT_TRUE(
      test::throws_kind([&] { sample_token(logits.data(), 5, NAN, 0, r); }, ErrorKind::input));
  EXPECT_TRUE(
      test::throws_kind([&] { sample_token(logits.data(), 5, 1.0, 6, r); }, ErrorKind::input));
  EXPECT_TRUE(
      test::throws_kind([&] { sample_token(logits.data(), 5, 1.0, -1, r); }, ErrorKind::input));
}

}  // namespace
}  // namespace ringtrain
