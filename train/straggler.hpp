// StragglerObserver: names a rank that is persistently slower than the others. Over a window
// of --straggler-window steps (the run's first step left out) each rank keeps its compute time
// before it enters the gradient reduction (after the reduction every rank looks equally slow:
// the fast ones wait) in every step, and sums its data wait and exposed communication; at the
// window's last step the ranks trade the median step's compute and the two means (one
// allgather of 3 doubles per rank), and a rank whose compute exceeds the median of the ranks
// by more than --straggler-threshold (and by 1 ms at least) is named by rank 0 with its host: one
// warning line when it becomes a straggler, a `straggler` metrics record per window, and
// TensorBoard scalars. Every rank keeps its own score (its compute over the median) for the
// Prometheus file, and a rank named slow at a step the timeline covers marks its last step's
// compute there (a `straggler` span on its own track).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/step_observers.hpp"
#include "train/timeline.hpp"

namespace ringtrain::launch {

class StragglerObserver : public StepObserver {
 public:
  StragglerObserver(int rank, std::vector<std::string> hosts, double threshold, int64_t window,
                    Console& console, MetricsWriter& metrics, EventWriter* tensorboard,
                    Timeline* timeline = nullptr)
      : rank_(rank),
        hosts_(std::move(hosts)),
        threshold_(threshold),
        window_(window),
        console_(console),
        metrics_(metrics),
        tensorboard_(tensorboard),
        timeline_(timeline),
        named_(hosts_.size(), false) {}
  void after(Phase phase, int64_t step, Clock::time_point begin, Clock::time_point end) override;
  void exchange(comm::Communicator& comm, int64_t step) override;
  // This rank's compute over the median of the last window (1: the median; 0: none yet).
  double score() const { return score_; }

 private:
  int rank_;
  std::vector<std::string> hosts_;
  double threshold_;
  int64_t window_;
  Console& console_;
  MetricsWriter& metrics_;
  EventWriter* tensorboard_;
  Timeline* timeline_;
  std::vector<bool> named_;  // rank 0: ranks warned about and still slow
  Clock::time_point data_end_, compute_begin_, compute_end_;  // the last step's compute
  int64_t steps_ = 0, first_step_ = 0;
  std::vector<double> compute_;     // this window: each step's compute
  double data_s_ = 0, comm_s_ = 0;  // this window, summed
  double score_ = 0;
  bool warm_ = false;  // past the run's first step, which is not counted
};

}  // namespace ringtrain::launch
