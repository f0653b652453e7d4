// The GPU communicators as the rest of ringtrain sees them, without CUDA or NCCL headers
// (design.md: only comm/nccl and kernels/cuda include them). In a build without CUDA the
// factories are input errors (comm/nccl/nccl_stub.cpp), so callers need no #if.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.hpp"

namespace ringtrain::comm {

// --comm nccl: collectives on device buffers run through NCCL on a dedicated stream that
// waits (by event) for the work queued on the device's compute stream; host buffers (the
// per-step metrics, run_and_agree()'s flags) go through MPI. Collective over `comm`; the NCCL
// unique id is broadcast over MPI. `device` is this rank's GPU.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, int device);
// --comm hierarchical on GPUs: the reduce-scatter / cross-node allreduce / allgather of
// comm/hierarchical with NCCL inside the node and NCCL across nodes.
std::unique_ptr<Communicator> make_nccl_hierarchical(MPI_Comm comm, int device);
// --comm mpi (or hierarchical over MPI) on GPUs: device buffers are staged through host
// memory around each collective of `inner`; host buffers pass straight through.
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> inner,
                                                       int device);
// "2.28.9" (the library loaded), or "not built".
std::string nccl_version();

}  // namespace ringtrain::comm
