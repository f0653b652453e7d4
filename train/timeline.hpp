// --timeline FILE: a Chrome trace (JSON; opens in Perfetto and chrome://tracing) of a window
// of steps (--timeline-steps A:B): per rank (pid) and thread (tid 0 main, 1 communication)
// spans for data wait, forward, backward per layer, each bucket's allreduce, unscale/check,
// optimizer and checkpoint. Each rank records its own spans; at the end rank 0 gathers and
// writes one file. Time zero is a barrier at start, so ranks line up to the barrier's skew.
// Off (no --timeline), the cost is one branch per span site. A run in which no step of the
// window ran (e.g. resumed after it) writes nothing, so an earlier run's trace survives.
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
  // written on rank 0 ("" elsewhere, when off, or when no span was recorded: rank 0 then
  // warns on stderr and leaves the file as it was). A failed write is a runtime error
  // naming the file.
  std::string write(MPI_Comm comm);

 private:
  std::string path_, events_;
  size_t spans_ = 0;  // recorded by this rank
  int64_t first_ = 0, last_ = -1;
  int rank_ = 0;
  Clock::time_point zero_;
};

// Input error unless `path` can be written, checked before training; unlike opening it for
// writing, this leaves an existing file (an earlier run's trace) as it is.
void check_timeline_path(const std::string& path);

// Parses "A:B" (1-based, inclusive); input error naming --timeline-steps otherwise.
std::pair<int64_t, int64_t> parse_step_window(const std::string& s);

}  // namespace ringtrain::launch
