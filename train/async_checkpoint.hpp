// Asynchronous checkpoints (--async-checkpoint): at a step boundary every rank copies what a
// save holds of its state (the masters or its shard of them, the optimizer state, the
// BatchNorm buffers; the metadata carries the loss scaler, data position and RNG seed) into
// staging memory, and a background thread writes it with the same CheckpointStore::save a
// synchronous save calls, so the file is the same. Training continues meanwhile.
//
// The writer thread's MPI calls (its own and parallel HDF5's) all go to a duplicate of the
// world communicator made here, so they never pair with the main thread's or the gradient
// thread's collectives; the job runs with MPI_THREAD_MULTIPLE (the constructor refuses
// otherwise). HDF5 itself is serialised by io::hdf5_mutex(), which the save releases while it
// waits in a barrier or writes chunk data directly (docs/architecture.md, "Asynchronous
// checkpoints"). At most one save is in flight; a save due while one is writes waits for it.
// A failure of the background write ends the job from the writer thread through fail_job()
// (exit 2, the previous checkpoint intact).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "io/checkpoint.hpp"

namespace ringtrain::launch {

class AsyncCheckpointer {
 public:
  // What a save writes, as views of the live state (CheckpointStore::save's arguments).
  struct State {
    std::vector<io::NamedTensor> params;
    std::vector<io::OptimizerState> optimizer;
    std::vector<io::NamedTensor> buffers;
  };
  // What a finished background save reports once (take_finished()).
  struct Finished {
    int64_t step = 0;
    uint64_t bytes = 0;
    double seconds = 0;  // the background write: save() from start to rename and prune
  };

  // Input error unless MPI gives MPI_THREAD_MULTIPLE (the writer thread calls MPI).
  static void require_supported();
  // Collective over `world` (duplicates it). Staging memory for `shape_of`'s tensors is
  // allocated and touched now, so that no save's copy waits for pages to be mapped.
  AsyncCheckpointer(io::CheckpointStore& store, MPI_Comm world, const State& shape_of);
  ~AsyncCheckpointer();  // waits for the save in flight
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Waits for the save in flight, if any; the seconds waited.
  double wait();
  // Waits for the save in flight, copies `state` into staging and starts writing checkpoint
  // meta.step in the background. Returns the seconds it waited for the previous save.
  double start(const io::CheckpointMeta& meta, const State& state);
  bool in_flight() const { return writer_.joinable() && !done_.load(); }
  // The last finished save, once (nullopt while it writes or when it was reported).
  std::optional<Finished> take_finished();
  uint64_t staging_bytes() const { return staging_bytes_; }

 private:
  // (Re)allocates the staging buffer for `state`'s tensors and points staged_ at it.
  void allocate(const State& state);
  void copy_in(const State& state);     // the state into staging (threads of the OpenMP pool)
  void write(io::CheckpointMeta meta);  // the writer thread's body

  io::CheckpointStore& store_;
  MPI_Comm comm_ = MPI_COMM_NULL;  // the writer's duplicate of the world communicator
  std::unique_ptr<std::byte[]> staging_;
  uint64_t staging_bytes_ = 0;
  State staged_;  // views into staging_, same names and parts as the live state
  std::thread writer_;
  std::atomic<bool> done_{false};
  bool reported_ = true;
  Finished last_;  // written by the writer before done_, read after it
};

}  // namespace ringtrain::launch
