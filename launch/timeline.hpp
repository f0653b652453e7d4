// --timeline FILE: a Chrome trace (JSON; opens in Perfetto and chrome://tracing) of a window
// of steps (--timeline-steps A:B): per rank (pid) and thread (tid 0 main, 1 communication)
// spans for data wait, forward, backward per layer, each bucket's allreduce, unscale/check,
// optimizer and checkpoint. Each rank records its own spans; at the end rank 0 gathers and
// writes one file. Time zero is a barrier at start, so ranks line up to the barrier's skew.
// Off (no --timeline), the cost is one branch per span site.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace ringtrain::launch {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  Timeline() = default;
  // Collective when path is non-empty (a barrier fixes time zero).
  Timeline(MPI_Comm comm, std::string path, int64_t first_step, int64_t last_step);
  bool on(int64_t step) const { return !path_.empty() && step >= first_ && step <= last_; }
  void span(const std::string& name, const char* category, int tid, Clock::time_point t0,
            Clock::time_point t1, int64_t step);
  // Collective: rank 0 gathers every rank's spans and writes the file. Returns the path
  // written on rank 0 ("" elsewhere or when off).
  std::string write(MPI_Comm comm);

 private:
  std::string path_, events_;
  int64_t first_ = 0, last_ = -1;
  int rank_ = 0;
  Clock::time_point zero_;
};

// Parses "A:B" (1-based, inclusive); input error naming --timeline-steps otherwise.
std::pair<int64_t, int64_t> parse_step_window(const std::string& s);

}  // namespace ringtrain::launch
