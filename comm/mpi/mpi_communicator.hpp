// The MPI backend of comm::Communicator. Wraps a duplicate of the given communicator (so
// ringtrain's traffic never mixes with the caller's) and finds the node layout with
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED).
#pragma once

#include <mpi.h>

#include <memory>

#include "comm/communicator.hpp"

namespace ringtrain::comm {

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates comm. Nodes are found with MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), or,
  // when RINGTRAIN_RANKS_PER_NODE=k is set, as groups of k consecutive ranks (to test
  // multi-node code on one machine). discover_nodes=false: one rank per "node" (for
  // sub-communicators, whose layout nobody asks for).
  explicit MpiCommunicator(MPI_Comm comm, bool discover_nodes = true);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  const char* backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  int node() const override { return node_; }
  int num_nodes() const override { return num_nodes_; }

  void allreduce(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, int64_t count, DType dtype, int root) override;
  void allgather(const void* send, void* recv, int64_t count, DType dtype) override;
  void barrier() override;
  void reduce_scatter(void* buf, const std::vector<int64_t>& counts, DType dtype,
                      ReduceOp op) override;
  void allgatherv(void* buf, const std::vector<int64_t>& counts, DType dtype) override;
  MPI_Comm mpi() const override { return comm_; }
  // The ranks of this node, and the ranks of every node with this local rank.
  MPI_Comm node_comm() const { return local_; }
  MPI_Comm cross_comm() const { return cross_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL, local_ = MPI_COMM_NULL, cross_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, node_ = 0, num_nodes_ = 1;
};

// "Open MPI v4.1.4, ..." (first line of MPI_Get_library_version).
std::string mpi_library_version();

// Call before MPI_Init: lets a rank's threads waiting in MPI give up their core. The
// gradient reducer's communication thread waits in MPI collectives while the rank's compute
// threads work; Open MPI's progress loop busy-polls by default, which takes a core from
// them whenever a node's threads outnumber its cores (docs/benchmarks.md, zero_bench). Sets
// OMPI_MCA_mpi_yield_when_idle=1 unless already set (the environment, mpirun -x or --mca
// win); other MPIs ignore it.
void prefer_yielding_mpi_waits();

}  // namespace ringtrain::comm
