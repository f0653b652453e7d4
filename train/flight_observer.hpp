// FlightObserver: the trainer's side of the flight recorder (comm/flight_recorder.hpp): each
// phase of a step (data, forward, backward, reduce, unscale, optimizer, checkpoint) as an
// entry begun at the phase's start and ended at its end, so that a dump shows the phase a
// rank is in; the step of each entry; and the dump at --flight-recorder-dump-step.
#pragma once

#include <array>
#include <cstdint>

#include "comm/flight_recorder.hpp"
#include "train/step_observers.hpp"

namespace ringtrain::launch {

class FlightObserver : public StepObserver {
 public:
  // dump_step > 0: dump after that step ("step N" in the dump's header); `announce` (rank
  // 0) says where the dumps are.
  FlightObserver(comm::FlightRecorder& recorder, int64_t dump_step, bool announce)
      : rec_(recorder), dump_step_(dump_step), announce_(announce) {}
  void begin_step(int64_t step) override { rec_.set_step(step); }
  void before(Phase phase, int64_t step) override;
  void after(Phase phase, int64_t step, Clock::time_point begin, Clock::time_point end) override;
  void end_step(const StepRecord& record) override;

  static const char* phase_name(Phase phase);

 private:
  static constexpr size_t kPhases = size_t(Phase::checkpoint) + 1;
  comm::FlightRecorder& rec_;
  int64_t dump_step_;
  bool announce_;
  std::array<uint64_t, kPhases> open_{};  // the entry of each phase begun and not yet ended
  std::array<bool, kPhases> is_open_{};
};

}  // namespace ringtrain::launch
