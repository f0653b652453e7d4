// FlightRecorder: every rank's ring of its last K collectives and training phases, for the
// question "where is each rank" after a job hangs or fails. Recording is two clock reads and
// a short lock per entry (always on); the ring is written as one JSON-lines file per rank
// (docs/formats.md, "Flight-recorder dump") when the job stalls or aborts (comm/stall.cpp,
// comm/control.cpp), on SIGUSR2 (train/signals.cpp wakes the dump thread), or at a
// configured step. `ringtrain analyze DIR` reads the dumps.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.hpp"

namespace ringtrain::comm {

struct FlightEntry {
  uint64_t id = 0;             // position in the recording: 0, 1, 2, ...
  int64_t seq = -1;            // a collective's number on its communicator (from 1); phases -1
  const char* kind = "";       // "allreduce", ... or a phase: "forward", "reduce", ...
  const char* comm = nullptr;  // the communicator's backend; nullptr: a phase
  const char* thread = "";     // "main" or "comm" (the gradient reducer's thread)
  int64_t step = 0, bucket = -1, count = 0;
  DType dtype = DType::f32;
  int64_t start_ns = 0, end_ns = 0;  // steady clock; end 0: not (yet) left
};

class FlightRecorder {
 public:
  struct Identity {
    int rank = 0, world_size = 1;
    std::vector<std::string> hosts;  // of every rank (the dump names them all)
    std::string job;                 // the scheduler's job id, or "local"
  };
  // capacity > 0 entries; dir "" records but never writes a dump. Becomes the process's
  // recorder (instance()) until destroyed.
  FlightRecorder(size_t capacity, std::string dir, Identity who);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;
  static FlightRecorder* instance();

  // A collective (seq > 0) or phase (comm nullptr, seq -1) starts; returns its id for end().
  uint64_t begin(const char* kind, const char* comm, int64_t seq, int64_t count, DType dtype);
  void end(uint64_t id);  // a no-op when the entry has left the ring
  // The step new entries belong to (the trainer sets it as a step begins).
  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }

  // Writes DIR/flight-rank-NNNNN.jsonl (through a .tmp and a rename) from a snapshot of the
  // ring, `reason` in its header. Thread-safe; returns the path, "" without a directory or
  // when the write failed (the error goes to stderr: dumps run on failure paths).
  std::string dump(const std::string& reason);
  // The dump of the job's end (stall or abort): only the first call of the process writes.
  std::string dump_final(const std::string& reason);
  // Dumps with reason "SIGUSR2" whenever a byte can be read from `fd` (the signal handler's
  // pipe), on a thread of its own, so that a rank blocked in a collective still dumps.
  void dump_on_readable(int fd);
  const std::string& dir() const { return dir_; }
  static std::string file_name(int rank);  // "flight-rank-00003.jsonl"

 private:
  std::vector<FlightEntry> snapshot(uint64_t* recorded) const;
  size_t capacity_;
  std::string dir_;
  Identity who_;
  int64_t wall0_ns_ = 0, steady0_ns_ = 0;  // the steady clock's origin in Unix time
  std::atomic<int64_t> step_{0};
  mutable std::mutex mu_;  // the ring and next_
  std::vector<FlightEntry> ring_;
  uint64_t next_ = 0;
  std::mutex dump_mu_;  // one dump at a time
  std::atomic<bool> final_done_{false};
  std::atomic<bool> stop_{false};
  std::thread dump_thread_;
};

// The bucket the collectives of this thread belong to while it lives (the gradient
// reducer's), and the name of the thread in the entries it records.
class FlightBucket {
 public:
  explicit FlightBucket(int64_t bucket);
  ~FlightBucket();
  FlightBucket(const FlightBucket&) = delete;
  FlightBucket& operator=(const FlightBucket&) = delete;

 private:
  int64_t saved_;
};
void set_flight_thread_name(const char* name);  // a string literal

}  // namespace ringtrain::comm
