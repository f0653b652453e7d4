// NCCL communicators (see nccl_communicator.hpp) and the factories of nccl_api.hpp.
#include "comm/nccl/nccl_communicator.hpp"

#include <algorithm>

#include <unistd.h>

#include "comm/hierarchical.hpp"
#include "comm/mpi/mpi_check.hpp"
#include "comm/nccl/nccl_api.hpp"
#include "core/error.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace ringtrain::comm {

void fail_nccl(const char* file, int line, const char* stmt, ncclResult_t r, ncclComm_t comm) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  int rank = -1, inited = 0;
  MPI_Initialized(&inited);
  if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const char* last = ncclGetLastError(comm);
  throw_runtime(
      file, line,
      cat("rank ", rank, " on ", host, ": ", stmt, " failed: ", ncclGetErrorString(r),
          last && *last ? cat(" (", last, ")") : std::string(),
          r == ncclSystemError || r == ncclRemoteError ? "; NCCL_DEBUG=WARN (or INFO) shows more"
                                                       : ""));
}

bool is_device_pointer(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
    case DType::f64:
      return ncclFloat64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm comm, int device, bool discover_nodes)
    : mpi_(std::make_unique<MpiCommunicator>(comm, discover_nodes)), device_(device) {
  // The device's runtime (stream, allocator) exists before any collective needs it.
  kernels::cuda::synchronize(device_);
  CUDA_CHECK(cudaSetDevice(device_));
  ncclUniqueId id{};
  if (mpi_->rank() == 0) NCCL_CHECK(nullptr, ncclGetUniqueId(&id));
  MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi_->mpi()));
  NCCL_CHECK(nullptr, ncclCommInitRank(&comm_, mpi_->size(), id, mpi_->rank()));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
}

NcclCommunicator::~NcclCommunicator() {
  // Errors are ignored: a destructor may run while an error unwinds the job.
  if (comm_) ncclCommDestroy(comm_);
  if (ready_) cudaEventDestroy(ready_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclCommunicator::begin() {
  CUDA_CHECK(cudaSetDevice(device_));
  auto compute = static_cast<cudaStream_t>(kernels::cuda::compute_stream(device_));
  CUDA_CHECK(cudaEventRecord(ready_, compute));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
}

void NcclCommunicator::end() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void NcclCommunicator::allreduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
  if (!is_device_pointer(buf)) return mpi_->allreduce(buf, count, dtype, op);
  begin();
  NCCL_CHECK(comm_,
             ncclAllReduce(buf, buf, size_t(count), nccl_type(dtype), nccl_op(op), comm_, stream_));
  end();
}

void NcclCommunicator::broadcast(void* buf, int64_t count, DType dtype, int root) {
  if (!is_device_pointer(buf)) return mpi_->broadcast(buf, count, dtype, root);
  begin();
  NCCL_CHECK(comm_, ncclBroadcast(buf, buf, size_t(count), nccl_type(dtype), root, comm_, stream_));
  end();
}

void NcclCommunicator::allgather(const void* send, void* recv, int64_t count, DType dtype) {
  const bool dev = is_device_pointer(recv);
  RT_CHECK(dev == is_device_pointer(send), "allgather between host and device memory");
  if (!dev) return mpi_->allgather(send, recv, count, dtype);
  begin();
  NCCL_CHECK(comm_, ncclAllGather(send, recv, size_t(count), nccl_type(dtype), comm_, stream_));
  end();
}

void NcclCommunicator::reduce_scatter(void* buf, const std::vector<int64_t>& counts, DType dtype,
                                      ReduceOp op) {
  if (!is_device_pointer(buf)) return mpi_->reduce_scatter(buf, counts, dtype, op);
  RT_CHECK(int(counts.size()) == size(), counts.size(), " segment counts for ", size(), " ranks");
  begin();
  const size_t es = dtype_size(dtype);
  char* p = static_cast<char*>(buf);
  if (std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; })) {
    // Equal segments (ZeRO's buckets inside the shards): NCCL's in-place reduce-scatter,
    // whose output is this rank's segment of the input.
    const size_t n = size_t(counts[0]);
    NCCL_CHECK(comm_, ncclReduceScatter(p, p + size_t(rank()) * n * es, n, nccl_type(dtype),
                                        nccl_op(op), comm_, stream_));
    end();
    return;
  }
  // Unequal segments: one in-place reduce per segment to its owner, grouped into one launch.
  NCCL_CHECK(comm_, ncclGroupStart());
  size_t off = 0;
  for (int r = 0; r < size(); ++r) {
    const size_t n = size_t(counts[size_t(r)]);
    NCCL_CHECK(comm_, ncclReduce(p + off * es, p + off * es, n, nccl_type(dtype), nccl_op(op), r,
                                 comm_, stream_));
    off += n;
  }
  NCCL_CHECK(comm_, ncclGroupEnd());
  end();
}

void NcclCommunicator::allgatherv(void* buf, const std::vector<int64_t>& counts, DType dtype) {
  if (!is_device_pointer(buf)) return mpi_->allgatherv(buf, counts, dtype);
  RT_CHECK(int(counts.size()) == size(), counts.size(), " segment counts for ", size(), " ranks");
  begin();
  const size_t es = dtype_size(dtype);
  char* p = static_cast<char*>(buf);
  if (std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; })) {
    // Equal segments: NCCL's in-place all-gather (input: this rank's segment of the output).
    const size_t n = size_t(counts[0]);
    NCCL_CHECK(comm_,
               ncclAllGather(p + size_t(rank()) * n * es, p, n, nccl_type(dtype), comm_, stream_));
    end();
    return;
  }
  // Unequal segments (the uneven last shard): one broadcast per segment from its owner.
  NCCL_CHECK(comm_, ncclGroupStart());
  size_t off = 0;
  for (int r = 0; r < size(); ++r) {
    const size_t n = size_t(counts[size_t(r)]);
    NCCL_CHECK(comm_,
               ncclBroadcast(p + off * es, p + off * es, n, nccl_type(dtype), r, comm_, stream_));
    off += n;
  }
  NCCL_CHECK(comm_, ncclGroupEnd());
  end();
}

// ---- factories ------------------------------------------------------------------------

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, int device) {
  return std::make_unique<NcclCommunicator>(comm, device);
}

std::unique_ptr<Communicator> make_nccl_hierarchical(MPI_Comm comm, int device) {
  auto world = std::make_unique<NcclCommunicator>(comm, device);
  MpiCommunicator& w = world->mpi_comm();
  auto node = std::make_unique<NcclCommunicator>(w.node_comm(), device, false);
  auto cross = std::make_unique<NcclCommunicator>(w.cross_comm(), device, false);
  return std::make_unique<HierarchicalCommunicator>(
      HierarchicalCommunicator::Parts{std::move(world), std::move(node), std::move(cross)},
      "hierarchical-nccl", [](const void* p) { return is_device_pointer(p); });
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  return cat(v / 10000, ".", v / 100 % 100, ".", v % 100);
}

}  // namespace ringtrain::comm
