// MPI communicator: node discovery, the collectives, and the user-defined MPI_Ops that sum
// fp16/bf16 with each add done in fp32 and rounded once (MPI has no 16-bit float types).
#include "comm/mpi/mpi_communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "comm/mpi/mpi_check.hpp"
#include "core/env.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain::comm {

std::string mpi_error_context(int code, const char* stmt) {
  char err[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(code, err, &len);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  int rank = -1, inited = 0;
  MPI_Initialized(&inited);
  if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return cat("rank ", rank, " on ", host, ": ", stmt, " failed: ", err);
}

namespace {

// inout[i] = round(float(in[i]) + float(inout[i])): widened in blocks with the vectorised
// host conversions, added in fp32, rounded once.
template <DType T>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  constexpr int kBlock = 1024;
  float a[kBlock], b[kBlock];
  const auto* pa = static_cast<const uint16_t*>(in);
  auto* pb = static_cast<uint16_t*>(inout);
  for (int lo = 0; lo < *len; lo += kBlock) {
    const int n = std::min(kBlock, *len - lo);
    kernels::host_to_f32(pa + lo, T, a, n);
    kernels::host_to_f32(pb + lo, T, b, n);
    for (int i = 0; i < n; ++i) b[i] += a[i];
    kernels::host_from_f32(b, pb + lo, T, n);
  }
}

struct Ops16 {
  MPI_Op sum_f16 = MPI_OP_NULL, sum_bf16 = MPI_OP_NULL;
};

// Created once per process, after MPI_Init; freed by MPI_Finalize.
const Ops16& ops16() {
  static Ops16 ops;
  static std::once_flag once;
  std::call_once(once, [] {
    MPI_CHECK(MPI_Op_create(&sum16<DType::f16>, 1, &ops.sum_f16));
    MPI_CHECK(MPI_Op_create(&sum16<DType::bf16>, 1, &ops.sum_bf16));
  });
  return ops;
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f16:
    case DType::bf16:
      return MPI_UINT16_T;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
    case DType::f64:
      return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  if (t == DType::f16 || t == DType::bf16) {
    RT_CHECK(op == ReduceOp::sum, "only sum is implemented for ", dtype_name(t));
    return t == DType::f16 ? ops16().sum_f16 : ops16().sum_bf16;
  }
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

// MPI counts are int: large buffers go in pieces of at most 1 Gi elements.
template <typename F>
void in_pieces(void* buf, int64_t count, DType dtype, F f) {
  constexpr int64_t kMaxCount = int64_t(1) << 30;
  char* p = static_cast<char*>(buf);
  for (int64_t done = 0; done < count;) {
    const int n = int(std::min(kMaxCount, count - done));
    f(p + done * int64_t(dtype_size(dtype)), n);
    done += n;
  }
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, bool discover_nodes) {
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  if (!discover_nodes) {
    MPI_CHECK(MPI_Comm_split(comm_, rank_, 0, &local_));
  } else if (const int64_t k = env::ranks_per_node()) {  // 0: unset
    MPI_CHECK(MPI_Comm_split(comm_, int(rank_ / k), rank_, &local_));
  } else {
    MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_));
  }
  MPI_CHECK(MPI_Comm_rank(local_, &local_rank_));
  MPI_CHECK(MPI_Comm_size(local_, &local_size_));
  // The ranks with this local rank, one per node; its leaders' comm numbers the nodes.
  MPI_CHECK(MPI_Comm_split(comm_, local_rank_, rank_, &cross_));
  if (local_rank_ == 0) {
    MPI_CHECK(MPI_Comm_rank(cross_, &node_));
    MPI_CHECK(MPI_Comm_size(cross_, &num_nodes_));
  }
  int layout[2] = {node_, num_nodes_};
  MPI_CHECK(MPI_Bcast(layout, 2, MPI_INT, 0, local_));
  node_ = layout[0];
  num_nodes_ = layout[1];
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&cross_, &local_, &comm_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

namespace {
void require_not_local_phase(const char* what) {
  RT_CHECK(!LocalPhase::active(), "MPI ", what,
           " inside a phase agreed by launch::run_and_agree(); collectives belong outside it");
}
}  // namespace

void MpiCommunicator::allreduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
  require_not_local_phase("allreduce");
  in_pieces(buf, count, dtype, [&](void* p, int n) {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p, n, mpi_type(dtype), mpi_op(op, dtype), comm_));
  });
}

void MpiCommunicator::broadcast(void* buf, int64_t count, DType dtype, int root) {
  require_not_local_phase("broadcast");
  in_pieces(buf, count, dtype,
            [&](void* p, int n) { MPI_CHECK(MPI_Bcast(p, n, mpi_type(dtype), root, comm_)); });
}

void MpiCommunicator::allgather(const void* send, void* recv, int64_t count, DType dtype) {
  require_not_local_phase("allgather");
  RT_CHECK(count <= INT_MAX, "allgather of ", count, " elements per rank");
  MPI_CHECK(
      MPI_Allgather(send, int(count), mpi_type(dtype), recv, int(count), mpi_type(dtype), comm_));
}

void MpiCommunicator::barrier() {
  require_not_local_phase("barrier");
  MPI_CHECK(MPI_Barrier(comm_));
}

namespace {
// MPI's int counts and displacements of a segment layout.
void int_layout(const std::vector<int64_t>& counts, int size, std::vector<int>& c,
                std::vector<int>& d) {
  RT_CHECK(int(counts.size()) == size, counts.size(), " segment counts for ", size, " ranks");
  c.resize(counts.size());
  d.resize(counts.size());
  int64_t off = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    RT_CHECK(counts[r] >= 0 && off + counts[r] <= INT_MAX, "segment layout beyond int counts");
    c[r] = int(counts[r]);
    d[r] = int(off);
    off += counts[r];
  }
}
}  // namespace

void MpiCommunicator::reduce_scatter(void* buf, const std::vector<int64_t>& counts, DType dtype,
                                     ReduceOp op) {
  require_not_local_phase("reduce_scatter");
  std::vector<int> c, d;
  int_layout(counts, size_, c, d);
  // MPI_IN_PLACE leaves the result at the start of buf: move it to this rank's segment.
  MPI_CHECK(
      MPI_Reduce_scatter(MPI_IN_PLACE, buf, c.data(), mpi_type(dtype), mpi_op(op, dtype), comm_));
  const size_t es = dtype_size(dtype);
  char* p = static_cast<char*>(buf);
  if (d[size_t(rank_)] != 0)
    std::memmove(p + size_t(d[size_t(rank_)]) * es, p, size_t(c[size_t(rank_)]) * es);
}

void MpiCommunicator::allgatherv(void* buf, const std::vector<int64_t>& counts, DType dtype) {
  require_not_local_phase("allgatherv");
  std::vector<int> c, d;
  int_layout(counts, size_, c, d);
  MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c.data(), d.data(),
                           mpi_type(dtype), comm_));
}

void Communicator::gatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                           DType dtype, int root) {
  std::vector<int> c, d;
  int_layout(counts, size(), c, d);
  MPI_CHECK(MPI_Gatherv(send, c[size_t(rank())], mpi_type(dtype), recv, c.data(), d.data(),
                        mpi_type(dtype), root, mpi()));
}

void prefer_yielding_mpi_waits() { setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0); }

std::string mpi_library_version() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(v, &len);
  std::string s(v, size_t(len));
  auto nl = s.find_first_of("\r\n");
  if (nl != std::string::npos) s.resize(nl);
  while (!s.empty() && (s.back() == ',' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace ringtrain::comm
