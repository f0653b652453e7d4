// Hierarchical allreduce for multi-rank nodes (the scheme Horovod uses): reduce-scatter
// within the node, allreduce across nodes among the ranks with the same local rank (each
// moving 1/local_size of the data over the network), allgather within the node. Built from
// two communicators: the node's ranks and the cross-node ranks of this local rank. Every
// node must hold the same number of ranks. Other collectives use the flat communicator.
#pragma once

#include <memory>

#include "comm/mpi/mpi_communicator.hpp"

namespace ringtrain::comm {

class HierarchicalCommunicator final : public Communicator {
 public:
  explicit HierarchicalCommunicator(MPI_Comm comm);  // input error on unequal nodes

  const char* backend() const override { return "hierarchical"; }
  int rank() const override { return world_->rank(); }
  int size() const override { return world_->size(); }
  int local_rank() const override { return world_->local_rank(); }
  int local_size() const override { return world_->local_size(); }
  int node() const override { return world_->node(); }
  int num_nodes() const override { return world_->num_nodes(); }

  void allreduce(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, int64_t count, DType dtype, int root) override {
    world_->broadcast(buf, count, dtype, root);
  }
  void allgather(const void* send, void* recv, int64_t count, DType dtype) override {
    world_->allgather(send, recv, count, dtype);
  }
  void barrier() override { world_->barrier(); }
  void reduce_scatter(void* buf, const std::vector<int64_t>& counts, DType dtype,
                      ReduceOp op) override {
    world_->reduce_scatter(buf, counts, dtype, op);
  }
  void allgatherv(void* buf, const std::vector<int64_t>& counts, DType dtype) override {
    world_->allgatherv(buf, counts, dtype);
  }
  MPI_Comm mpi() const override { return world_->mpi(); }

 private:
  std::unique_ptr<MpiCommunicator> world_, node_, cross_;
};

}  // namespace ringtrain::comm
