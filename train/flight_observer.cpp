// The trainer's phases in the flight recorder (see flight_observer.hpp).
#include "train/flight_observer.hpp"

#include <iostream>

#include "core/error.hpp"

namespace ringtrain::launch {

const char* FlightObserver::phase_name(Phase phase) {
  switch (phase) {
    case Phase::data:
      return "data";
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::reduce:
      return "reduce";
    case Phase::unscale:
      return "unscale";
    case Phase::optimizer:
      return "optimizer";
    case Phase::gather:
      return "gather";
    case Phase::checkpoint:
      return "checkpoint";
  }
  return "?";
}

void FlightObserver::before(Phase phase, int64_t step) {
  // --zero 1's all-gather waits are spread over the next forward; its collectives are
  // recorded by the communicator.
  if (phase == Phase::gather) return;
  if (phase == Phase::checkpoint) rec_.set_step(step);
  const auto i = size_t(phase);
  open_[i] = rec_.begin(phase_name(phase), nullptr, -1, 0, DType::f32);
  is_open_[i] = true;
}

void FlightObserver::after(Phase phase, int64_t, Clock::time_point, Clock::time_point) {
  const auto i = size_t(phase);
  if (!is_open_[i]) return;
  rec_.end(open_[i]);
  is_open_[i] = false;
}

void FlightObserver::end_step(const StepRecord& record) {
  if (dump_step_ <= 0 || record.step != dump_step_) return;
  const std::string path = rec_.dump(cat("step ", record.step, " (--flight-recorder-dump-step)"));
  if (announce_ && !path.empty())
    std::cerr << cat("ringtrain: flight recorders of step ", record.step, " written to ",
                     rec_.dir(), " (ringtrain analyze ", rec_.dir(), ")\n")
              << std::flush;
}

}  // namespace ringtrain::launch
