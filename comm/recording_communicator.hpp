// RecordingCommunicator: a Communicator that passes every collective to another one and
// records it in the process's FlightRecorder (comm/flight_recorder.hpp): its sequence number
// on this communicator (the same collective has the same number on every rank, since all
// ranks call a communicator's collectives in the same order), kind, element count, dtype,
// the bucket of the calling thread, and when it was entered and left.
#pragma once

#include <atomic>
#include <memory>

#include "comm/communicator.hpp"
#include "comm/flight_recorder.hpp"

namespace ringtrain::comm {

class RecordingCommunicator : public Communicator {
 public:
  // `inner` is used, not owned (it outlives this); `recorder` too.
  RecordingCommunicator(Communicator& inner, FlightRecorder& recorder)
      : inner_(inner), rec_(recorder) {}
  const char* backend() const override { return inner_.backend(); }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  int local_rank() const override { return inner_.local_rank(); }
  int local_size() const override { return inner_.local_size(); }
  int node() const override { return inner_.node(); }
  int num_nodes() const override { return inner_.num_nodes(); }
  MPI_Comm mpi() const override { return inner_.mpi(); }

  void allreduce(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, int64_t count, DType dtype, int root) override;
  void allgather(const void* send, void* recv, int64_t count, DType dtype) override;
  void barrier() override;
  void reduce_scatter(void* buf, const std::vector<int64_t>& counts, DType dtype,
                      ReduceOp op) override;
  void allgatherv(void* buf, const std::vector<int64_t>& counts, DType dtype) override;

 private:
  // Records the collective around fn().
  template <typename Fn>
  void recorded(const char* kind, int64_t count, DType dtype, Fn&& fn);
  Communicator& inner_;
  FlightRecorder& rec_;
  std::atomic<int64_t> seq_{0};
};

}  // namespace ringtrain::comm
