// Closed forms of the learning-rate schedules (see schedule.hpp). With W warm-up steps and
// D decay steps, at step t (completed optimizer steps):
//   t < W:  init + (base - init) * t / W                      (LinearLR / LambdaLR warm-up)
//   then u = min(t - W, D - W) / (D - W), the decay's progress, clamped at 1:
//   cosine        min + (base - min) * (1 + cos(pi u)) / 2    (CosineAnnealingLR, T_max = D - W)
//   linear        base + (min - base) * u                     (LinearLR to min / base)
//   step          base * gamma^floor((t - W) / every)         (StepLR)
//   inverse-sqrt  base * sqrt(max(W, 1) / max(t, 1))          (fairseq's inverse_sqrt)
//   constant      base
// Past D, cosine and linear stay at min (PyTorch's cosine would rise again).
#include "nn/schedule.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace ringtrain {

LrSchedule::LrSchedule(const ScheduleConfig& cfg, double base_lr, int64_t total_steps)
    : cfg_(cfg), base_(base_lr), decay_(cfg.decay_steps ? cfg.decay_steps : total_steps) {
  const std::string& n = cfg.name;
  RT_REQUIRE(
      n == "constant" || n == "cosine" || n == "linear" || n == "step" || n == "inverse-sqrt",
      "--lr-schedule '", n,
      "' is not known; expected constant, cosine, linear, step or "
      "inverse-sqrt");
  RT_REQUIRE(cfg.warmup_steps >= 0, "--warmup-steps ", cfg.warmup_steps,
             " is not valid: must be >= 0");
  RT_REQUIRE(cfg.warmup_init_lr >= 0 && cfg.warmup_init_lr <= base_lr, "--warmup-init-lr ",
             cfg.warmup_init_lr, " is not valid: must be in [0, --lr ", base_lr, "]");
  RT_REQUIRE(cfg.min_lr >= 0 && cfg.min_lr <= base_lr, "--min-lr ", cfg.min_lr,
             " is not valid: must be in [0, --lr ", base_lr, "]");
  if (n == "cosine" || n == "linear")
    RT_REQUIRE(decay_ > cfg.warmup_steps, "--lr-schedule ", n, " decays from the end of warm-up (",
               cfg.warmup_steps, " steps) to --decay-steps ", decay_,
               (cfg.decay_steps ? "" : " (the run's steps)"),
               "; give --decay-steps larger than --warmup-steps, or fewer --warmup-steps");
  if (n == "step")
    RT_REQUIRE(cfg.step_every > 0, "--lr-schedule step needs --step-every N > 0 (got ",
               cfg.step_every, ")");
  RT_REQUIRE(cfg.step_gamma > 0 && cfg.step_gamma <= 1, "--step-gamma ", cfg.step_gamma,
             " is not valid: must be in (0, 1]");
}

double LrSchedule::lr(int64_t t) const {
  const int64_t w = cfg_.warmup_steps;
  if (t < w) return cfg_.warmup_init_lr + (base_ - cfg_.warmup_init_lr) * double(t) / double(w);
  const std::string& n = cfg_.name;
  if (n == "cosine" || n == "linear") {
    const double u = double(std::min(t - w, decay_ - w)) / double(decay_ - w);
    if (n == "linear") return base_ + (cfg_.min_lr - base_) * u;
    return cfg_.min_lr + (base_ - cfg_.min_lr) * (1 + std::cos(M_PI * u)) / 2;
  }
  if (n == "step") return base_ * std::pow(cfg_.step_gamma, double((t - w) / cfg_.step_every));
  if (n == "inverse-sqrt")
    return base_ * std::sqrt(double(std::max<int64_t>(w, 1)) / double(std::max<int64_t>(t, 1)));
  return base_;
}

}  // namespace ringtrain
