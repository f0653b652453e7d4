// Unit tests of the dynamic loss scaler (nn/loss_scaler.hpp), step by step: growth after
// growth_interval finite steps, backoff and skip on overflow, the floor and its one-time
// warning, the static mode, config validation and restore().
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>

#include "nn/loss_scaler.hpp"
#include "test_util.hpp"

namespace ringtrain {
namespace {

using test::throws_kind;

LossScalerConfig small_interval() {
  LossScalerConfig c;
  c.growth_interval = 3;
  return c;
}

TEST(LossScaler, DefaultsMatchGradScaler) {
  LossScaler s{LossScalerConfig{}};
  EXPECT_EQ(s.scale(), 65536.f);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_FALSE(s.floor_hit());
}

TEST(LossScaler, GrowsAfterExactlyIntervalFiniteSteps) {
  LossScaler s(small_interval());
  for (int64_t i = 1; i <= 2; ++i) {
    EXPECT_TRUE(s.update(false)) << "step " << i;
    EXPECT_EQ(s.scale(), 65536.f) << "step " << i;
    EXPECT_EQ(s.growth_tracker(), i) << "step " << i;
  }
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 131072.f);
  EXPECT_EQ(s.growth_tracker(), 0) << "the tracker restarts after growing";
  // The next growth again needs a full interval.
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 131072.f);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 262144.f);
  EXPECT_FALSE(s.floor_hit());
}

TEST(LossScaler, BacksOffAndSkipsOnNonFinite) {
  LossScaler s(small_interval());
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  ASSERT_EQ(s.growth_tracker(), 2);
  EXPECT_FALSE(s.update(true)) << "a non-finite step is skipped";
  EXPECT_EQ(s.scale(), 32768.f);
  EXPECT_EQ(s.growth_tracker(), 0) << "an overflow resets the run of finite steps";
  // Two finite steps after the overflow do not grow it (the earlier two do not count).
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 32768.f);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 65536.f);
  // Consecutive overflows halve each time.
  EXPECT_FALSE(s.update(true));
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 16384.f);
}

TEST(LossScaler, FloorIsNeverCrossedAndReportedOnce) {
  LossScalerConfig c = small_interval();
  c.init_scale = 8.f;
  c.min_scale = 2.f;
  LossScaler s(c);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 4.f);
  EXPECT_FALSE(s.floor_hit());
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 2.f);
  EXPECT_TRUE(s.floor_hit()) << "reported on the update that reached the floor";
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(s.update(true)) << "overflow " << i << " at the floor still skips";
    EXPECT_EQ(s.scale(), 2.f) << "overflow " << i;
    EXPECT_FALSE(s.floor_hit()) << "reported only once, overflow " << i;
  }
  EXPECT_TRUE(s.update(false));
  EXPECT_FALSE(s.floor_hit()) << "a finite step clears the flag";
  // Growing off the floor re-arms the warning.
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 4.f);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 2.f);
  EXPECT_TRUE(s.floor_hit());
}

TEST(LossScaler, FloorBetweenBackoffSteps) {
  // 6 * 0.5 = 3 is below the floor 4: the scale stops at 4, not 3.
  LossScalerConfig c;
  c.init_scale = 6.f;
  c.min_scale = 4.f;
  LossScaler s(c);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 4.f);
  EXPECT_TRUE(s.floor_hit());
}

TEST(LossScaler, FloorEqualToInitialScale) {
  // Starting at the floor: the first overflow is what reports it.
  LossScalerConfig c;
  c.init_scale = 1.f;
  c.min_scale = 1.f;
  LossScaler s(c);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 1.f);
  EXPECT_TRUE(s.floor_hit());
  EXPECT_FALSE(s.update(true));
  EXPECT_FALSE(s.floor_hit());
}

TEST(LossScaler, GrowthStopsBeforeInfinity) {
  LossScalerConfig c;
  c.init_scale = FLT_MAX;
  c.growth_interval = 1;
  LossScaler s(c);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), FLT_MAX);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(LossScaler, StaticKeepsScaleButSkipsNonFinite) {
  LossScalerConfig c = small_interval();
  c.dynamic = false;
  c.init_scale = 1024.f;
  LossScaler s(c);
  for (int i = 0; i < 7; ++i) {
    EXPECT_TRUE(s.update(false)) << "step " << i;
    EXPECT_EQ(s.scale(), 1024.f) << "step " << i;
  }
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 1024.f);
  EXPECT_FALSE(s.floor_hit());
  EXPECT_TRUE(s.update(false));
}

TEST(LossScaler, BadConfigsAreInputErrors) {
  auto with = [](auto change) {
    return [change] {
      LossScalerConfig c;
      change(c);
      LossScaler s(c);
    };
  };
  const auto input = ErrorKind::input;
  EXPECT_TRUE(throws_kind(with([](auto& c) { c.init_scale = 0.f; }), input));
  EXPECT_TRUE(throws_kind(with([](auto& c) { c.init_scale = -1.f; }), input));
  EXPECT_TRUE(throws_kind(with([](auto& c) { c.init_scale = INFINITY; }), input));
  EXPECT_TRUE(throws_kind(with([](auto& c) { c.init_scale = NAN; }), input));
  EXPECT_TRUE(throws_kind(with([](auto& c) { c.growth_factor = 1.f; }), input));
  EXPECT_TRUE(throws_kind(with([](auto& c) { c.growth_factor = 0.5f; }), input));
  EXPECT_TRUE(throws_kind(with([](auto& c) { c.backoff_factor = 0.f; }), input));
  EXPECT_TRUE(throws_kind(with([](auto& c) { c.backoff_factor = 1.f; }), input));
  EXPECT_TRUE(throws_kind(with([](auto& c) { c.backoff_factor = 2.f; }), input));
  EXPECT_TRUE(throws_kind(with([](auto& c) { c.growth_interval = 0; }), input));
  EXPECT_TRUE(throws_kind(with([](auto& c) { c.growth_interval = -5; }), input));
  EXPECT_TRUE(throws_kind(with([](auto& c) { c.min_scale = 0.f; }), input));
  EXPECT_TRUE(throws_kind(with([](auto& c) { c.min_scale = 131072.f; }), input));
  // The edges that are allowed.
  EXPECT_NO_THROW(with([](auto& c) { c.min_scale = c.init_scale; })());
  EXPECT_NO_THROW(with([](auto& c) { c.growth_interval = 1; })());
}

TEST(LossScaler, Restore) {
  LossScaler s(small_interval());
  s.restore(1024.f, 2);
  EXPECT_EQ(s.scale(), 1024.f);
  EXPECT_EQ(s.growth_tracker(), 2);
  EXPECT_TRUE(s.update(false)) << "the restored run of finite steps counts";
  EXPECT_EQ(s.scale(), 2048.f);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_TRUE(throws_kind([&] { s.restore(0.f, 0); }, ErrorKind::input));
  EXPECT_TRUE(throws_kind([&] { s.restore(-2.f, 0); }, ErrorKind::input));
  EXPECT_TRUE(throws_kind([&] { s.restore(INFINITY, 0); }, ErrorKind::input));
  EXPECT_TRUE(throws_kind([&] { s.restore(NAN, 0); }, ErrorKind::input));
  EXPECT_EQ(s.scale(), 2048.f) << "a rejected restore leaves the state alone";
}

// A tracker saved under a longer --scale-growth-interval than the resumed run's must not
// stop the scale from ever growing again.
TEST(LossScaler, RestoredTrackerBeyondTheIntervalStillGrows) {
  LossScaler s(small_interval());  // interval 3
  s.restore(1024.f, 5);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 2048.f);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_TRUE(throws_kind([&] { s.restore(1024.f, -2); }, ErrorKind::input));
}

}  // namespace
}  // namespace ringtrain
