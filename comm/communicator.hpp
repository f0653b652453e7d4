// comm::Communicator: the collectives data-parallel training needs, on flat buffers of a
// DType. Backends: MPI (comm/mpi) and hierarchical (comm/hierarchical, built from two MPI
// communicators); NCCL arrives with the CUDA backend.
// Float sums in fp16/bf16 add in fp32 and round once per add.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "core/dtype.hpp"

namespace ringtrain::comm {

enum class ReduceOp { sum, max, min };

// Marks the calling thread as running a phase whose failure is agreed afterwards by one
// collective (launch::agree). Such a phase must not run collectives itself: a rank that
// failed before reaching one would pair its agreement with another rank's collective. The
// MPI communicator refuses collectives inside it (an internal error, caught by tests).
class LocalPhase {
 public:
  LocalPhase() { ++depth(); }
  ~LocalPhase() { --depth(); }
  LocalPhase(const LocalPhase&) = delete;
  LocalPhase& operator=(const LocalPhase&) = delete;
  static bool active() { return depth() > 0; }

 private:
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const char* backend() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // among the ranks of this node
  virtual int local_size() const = 0;
  virtual int node() const = 0;  // index of this node, 0..num_nodes-1
  virtual int num_nodes() const = 0;

  virtual void allreduce(void* buf, int64_t count, DType dtype, ReduceOp op = ReduceOp::sum) = 0;
  virtual void broadcast(void* buf, int64_t count, DType dtype, int root) = 0;
  // recv holds size() * count elements, rank r's contribution at r * count.
  virtual void allgather(const void* send, void* recv, int64_t count, DType dtype) = 0;
  virtual void barrier() = 0;
  // In place over buf holding sum(counts) elements, segment r at offset sum(counts[<r]):
  // reduce_scatter leaves on rank r its segment reduced over all ranks (other segments
  // undefined); allgatherv fills every segment with its owner's values.
  virtual void reduce_scatter(void* buf, const std::vector<int64_t>& counts, DType dtype,
                              ReduceOp op = ReduceOp::sum) = 0;
  virtual void allgatherv(void* buf, const std::vector<int64_t>& counts, DType dtype) = 0;
  // Rank r's counts[r] elements at `send` onto `root`'s recv (sum(counts) elements there,
  // rank r's at offset sum(counts[<r]); recv is not read elsewhere). For host results that
  // only the writing rank needs (predictions, samples): every backend runs it over mpi().
  void gatherv(const void* send, void* recv, const std::vector<int64_t>& counts, DType dtype,
               int root);
  // An MPI communicator over the same ranks, for what MPI itself must do (MPI-IO
  // checkpoints); every backend is bootstrapped by MPI.
  virtual MPI_Comm mpi() const = 0;
};

}  // namespace ringtrain::comm
