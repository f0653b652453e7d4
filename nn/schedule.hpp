// Learning-rate schedules (--lr-schedule): a linear warm-up followed by constant, cosine,
// linear, step or inverse-square-root decay, as closed forms of the optimizer step, so that
// a resumed run needs nothing but the checkpoint's step to continue the schedule exactly.
// Each equals PyTorch's scheduler recipe (tests/ref/make_schedule_ref.py).
#pragma once

#include <cstdint>
#include <string>

namespace ringtrain {

struct ScheduleConfig {
  std::string name = "constant";  // constant | cosine | linear | step | inverse-sqrt
  int64_t warmup_steps = 0;       // linear from warmup_init_lr to the base lr
  double warmup_init_lr = 0;
  double min_lr = 0;        // cosine and linear decay end here
  int64_t decay_steps = 0;  // the step where cosine/linear reach min_lr (0: the run's end)
  int64_t step_every = 0;   // step: multiply by step_gamma every N steps after warm-up
  double step_gamma = 0.1;
};

class LrSchedule {
 public:
  // Input error (naming the option) for an unknown name or values that do not fit together.
  // total_steps stands in for decay_steps == 0.
  LrSchedule(const ScheduleConfig& cfg, double base_lr, int64_t total_steps);
  // The learning rate of the optimizer step that follows `done` completed steps (0-based):
  // PyTorch's lr after `done` calls of scheduler.step().
  double lr(int64_t done) const;
  const ScheduleConfig& config() const { return cfg_; }
  int64_t decay_steps() const { return decay_; }

 private:
  ScheduleConfig cfg_;
  double base_;
  int64_t decay_;
};

}  // namespace ringtrain
