// Hierarchical allreduce for multi-rank nodes (the scheme Horovod uses): reduce-scatter
// within the node, allreduce across nodes among the ranks with the same local rank (each
// moving 1/local_size of the data over the network), allgather within the node. Built once
// over two communicators of any backend -- the node's ranks and the cross-node ranks of
// this local rank -- so MPI (--comm hierarchical on CPUs) and NCCL (on GPUs, through
// comm/nccl's make_nccl_hierarchical) share it. Every node must hold the same number of
// ranks. Other collectives use the flat communicator.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/mpi/mpi_communicator.hpp"

namespace ringtrain::comm {

class HierarchicalCommunicator final : public Communicator {
 public:
  // The three communicators: `world` (the flat one: every collective but the hierarchical
  // allreduce), `node` (this node's ranks) and `cross` (the ranks of this local rank on the
  // other nodes).
  struct Parts {
    std::unique_ptr<Communicator> world, node, cross;
  };
  // Over MPI: the flat, node and cross-node communicators of `comm`. Collective; an input
  // error on every rank when the nodes hold different numbers of ranks.
  explicit HierarchicalCommunicator(MPI_Comm comm);
  // Over any backend. `split(buf)` says whether an allreduce of buf takes the hierarchical
  // path (NCCL: device buffers only; host buffers go to world's MPI); `backend` names it in
  // the banner. Collective over world, with the same check.
  HierarchicalCommunicator(Parts parts, std::string backend,
                           std::function<bool(const void*)> split = {});

  const char* backend() const override { return backend_.c_str(); }
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
  std::unique_ptr<Communicator> world_, node_, cross_;
  std::string backend_;
  std::function<bool(const void*)> split_;
};

}  // namespace ringtrain::comm
