// NcclCommunicator: comm::Communicator over NCCL for device buffers (MPI for host ones);
// comm/hierarchical builds the hierarchical allreduce from two of them. Internal to comm/nccl; the
// rest of ringtrain uses the factories of nccl_api.hpp.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>

#include "comm/mpi/mpi_communicator.hpp"

// NCCL_CHECK: on failure, throws ringtrain::Error with the rank, host, file:line, the
// statement, ncclGetErrorString and ncclGetLastError (the detail NCCL keeps, e.g. which
// peer's connection broke).
#define NCCL_CHECK(nccl_comm, stmt)                                                   \
  do {                                                                                \
    ncclResult_t rt_nccl_r_ = (stmt);                                                 \
    if (rt_nccl_r_ != ncclSuccess && rt_nccl_r_ != ncclInProgress)                    \
      ::ringtrain::comm::fail_nccl(__FILE__, __LINE__, #stmt, rt_nccl_r_, nccl_comm); \
  } while (0)

namespace ringtrain::comm {

[[noreturn]] void fail_nccl(const char* file, int line, const char* stmt, ncclResult_t r,
                            ncclComm_t comm);

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `comm`. discover_nodes as MpiCommunicator (false for sub-communicators).
  NcclCommunicator(MPI_Comm comm, int device, bool discover_nodes = true);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  const char* backend() const override { return "nccl"; }
  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  int local_rank() const override { return mpi_->local_rank(); }
  int local_size() const override { return mpi_->local_size(); }
  int node() const override { return mpi_->node(); }
  int num_nodes() const override { return mpi_->num_nodes(); }

  void allreduce(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, int64_t count, DType dtype, int root) override;
  void allgather(const void* send, void* recv, int64_t count, DType dtype) override;
  void barrier() override { mpi_->barrier(); }
  void reduce_scatter(void* buf, const std::vector<int64_t>& counts, DType dtype,
                      ReduceOp op) override;
  void allgatherv(void* buf, const std::vector<int64_t>& counts, DType dtype) override;
  MPI_Comm mpi() const override { return mpi_->mpi(); }
  MpiCommunicator& mpi_comm() { return *mpi_; }

 private:
  // Before a collective: this thread on our device, our stream after the compute stream.
  void begin();
  // After it: wait for our stream (the interface is synchronous).
  void end();

  std::unique_ptr<MpiCommunicator> mpi_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;  // the dedicated communication stream
  cudaEvent_t ready_ = nullptr;    // marks the compute stream's work before a collective
};

// True when p is device (or managed) memory.
bool is_device_pointer(const void* p);

}  // namespace ringtrain::comm
