// Dynamic loss scaling with the semantics of PyTorch's GradScaler: start at init_scale,
// multiply by growth_factor after growth_interval consecutive finite steps, multiply by
// backoff_factor and skip the step when a gradient is inf/nan. Adds a floor (min_scale)
// below which the scale never falls, reported once when reached.
#pragma once

#include <cstdint>

namespace ringtrain {

struct LossScalerConfig {
  bool dynamic = true;  // false: a constant scale (still skips non-finite steps)
  float init_scale = 65536.f;
  float growth_factor = 2.f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 2000;
  float min_scale = 1.f;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& cfg);  // input error on a bad config

  float scale() const { return scale_; }
  int64_t growth_tracker() const { return tracker_; }
  // Records one step's outcome; returns true when the step is to be applied.
  bool update(bool found_nonfinite);
  // True once, on the update that brought the scale down to the floor (or found it there
  // and it still overflowed): the caller warns the user.
  bool floor_hit() const { return floor_hit_; }
  void restore(float scale, int64_t tracker);

 private:
  LossScalerConfig cfg_;
  float scale_;
  int64_t tracker_ = 0;
  bool floor_hit_ = false;
  bool warned_ = false;
};

}  // namespace ringtrain
