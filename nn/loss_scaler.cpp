// The loss-scaler state machine (see loss_scaler.hpp).
#include "nn/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace ringtrain {

LossScaler::LossScaler(const LossScalerConfig& cfg) : cfg_(cfg), scale_(cfg.init_scale) {
  RT_REQUIRE(std::isfinite(cfg.init_scale) && cfg.init_scale > 0.f, "--init-scale ", cfg.init_scale,
             " is not valid; expected a positive finite number");
  RT_REQUIRE(cfg.growth_factor > 1.f, "loss-scale growth factor ", cfg.growth_factor,
             " must be greater than 1");
  RT_REQUIRE(cfg.backoff_factor > 0.f && cfg.backoff_factor < 1.f, "loss-scale backoff factor ",
             cfg.backoff_factor, " must be in (0, 1)");
  RT_REQUIRE(cfg.growth_interval >= 1, "--scale-growth-interval ", cfg.growth_interval,
             " is not valid; expected a positive number of steps");
  RT_REQUIRE(cfg.min_scale > 0.f && cfg.min_scale <= cfg.init_scale, "--min-scale ", cfg.min_scale,
             " must be positive and at most the initial scale ", cfg.init_scale);
}

bool LossScaler::update(bool found_nonfinite) {
  floor_hit_ = false;
  if (!cfg_.dynamic) return !found_nonfinite;
  if (found_nonfinite) {
    const bool was_at_floor = scale_ <= cfg_.min_scale;
    scale_ = std::max(scale_ * cfg_.backoff_factor, cfg_.min_scale);
    tracker_ = 0;
    if ((was_at_floor || scale_ <= cfg_.min_scale) && !warned_) floor_hit_ = warned_ = true;
    return false;
  }
  // >=: a tracker restored from a run with a longer interval still grows at once.
  if (++tracker_ >= cfg_.growth_interval) {
    const float grown = scale_ * cfg_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;
    tracker_ = 0;
    warned_ = false;
  }
  return true;
}

void LossScaler::restore(float scale, int64_t tracker) {
  RT_REQUIRE(std::isfinite(scale) && scale > 0.f, "stored loss scale ", scale, " is not valid");
  RT_REQUIRE(tracker >= 0, "stored loss-scale growth tracker ", tracker, " is negative");
  scale_ = scale;
  tracker_ = tracker;
}

}  // namespace ringtrain
