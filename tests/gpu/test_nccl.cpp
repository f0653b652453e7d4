// The NCCL communicator under mpiexec (ctest runs it at 1 rank; it is written for any
// number of ranks with one GPU each): allreduce of device buffers in every dtype, host
// buffers through MPI, the unequal-segment reduce-scatter and allgatherv, the hierarchical
// NCCL allreduce, MPI staged through host memory, and the GradReducer reducing device
// gradient buckets through NCCL. Every rank skips, visibly, without a CUDA device.
#include <mpi.h>

#include "comm/grad_reducer.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "comm/nccl/nccl_api.hpp"
#include "tests/gpu/gpu_util.hpp"

namespace ringtrain::test {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

class NcclTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    RT_NEED_GPU();
    (void)gpu_backend();
  }
};

// Rank r contributes (i % 7) + r: the sum is size * (i % 7) + size (size - 1) / 2.
std::vector<float> contribution(int64_t n, int rank) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(i % 7 + rank);
  return v;
}
std::vector<float> expected_sum(int64_t n, int size) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(size * (i % 7) + size * (size - 1) / 2);
  return v;
}

TEST_P(NcclTest, AllreduceDeviceAndHostBuffers) {
  auto comm = comm::make_nccl_communicator(MPI_COMM_WORLD, 0);
  EXPECT_STREQ(comm->backend(), "nccl");
  const int64_t n = 100003;
  Pair buf = make_pair({n}, GetParam(), contribution(n, comm->rank()));
  comm->allreduce(buf.d().data, n, GetParam(), comm::ReduceOp::sum);
  EXPECT_TRUE(all_close(floats(buf.d()), expected_sum(n, comm->size()), 0, 0));
  double host[2] = {1.5, double(comm->rank())};  // host memory: the MPI path
  comm->allreduce(host, 2, DType::f64, comm::ReduceOp::sum);
  EXPECT_EQ(host[0], 1.5 * comm->size());
}

TEST_P(NcclTest, ReduceScatterAllgathervUnequalSegments) {
  auto comm = comm::make_nccl_communicator(MPI_COMM_WORLD, 0);
  std::vector<int64_t> counts;
  int64_t n = 0;
  for (int r = 0; r < comm->size(); ++r) counts.push_back(1000 + 17 * r), n += counts.back();
  Pair buf = make_pair({n}, GetParam(), contribution(n, comm->rank()));
  comm->reduce_scatter(buf.d().data, counts, GetParam(), comm::ReduceOp::sum);
  // Only this rank's segment is defined; allgatherv then fills all of them.
  comm->allgatherv(buf.d().data, counts, GetParam());
  EXPECT_TRUE(all_close(floats(buf.d()), expected_sum(n, comm->size()), 0, 0));
}

TEST_P(NcclTest, HierarchicalAndStaged) {
  const int64_t n = 4099;
  auto hier = comm::make_nccl_hierarchical(MPI_COMM_WORLD, 0);
  Pair a = make_pair({n}, GetParam(), contribution(n, hier->rank()));
  hier->allreduce(a.d().data, n, GetParam(), comm::ReduceOp::sum);
  EXPECT_TRUE(all_close(floats(a.d()), expected_sum(n, hier->size()), 0, 0));
  auto staged =
      comm::make_staged_communicator(std::make_unique<comm::MpiCommunicator>(MPI_COMM_WORLD), 0);
  Pair b = make_pair({n}, GetParam(), contribution(n, staged->rank()));
  staged->allreduce(b.d().data, n, GetParam(), comm::ReduceOp::sum);
  EXPECT_TRUE(all_close(floats(b.d()), expected_sum(n, staged->size()), 0, 0));
}

TEST_P(NcclTest, GradReducerBucketsOnDevice) {
  auto comm = comm::make_nccl_communicator(MPI_COMM_WORLD, 0);
  // Three "layers" of 5000, 300 and 70000 parameters; small buckets so there are several.
  const std::vector<std::pair<int64_t, int64_t>> params = {{0, 5000}, {5000, 300}, {5300, 70000}};
  const int64_t n = 75300;
  Pair grad = make_pair({n}, GetParam(), contribution(n, comm->rank()));
  comm::ReducerConfig rc;
  rc.wire = GetParam();  // in place: the reducer's casts to another wire dtype are host code
  rc.bucket_bytes = 64 << 10;
  rc.first_bucket_bytes = 16 << 10;
  rc.stall_timeout_s = 0;
  comm::GradReducer reducer(*comm, rc, grad.d(), params, {0, 1, 2});
  EXPECT_GE(reducer.buckets().size(), size_t(2));
  for (int step = 1; step <= 2; ++step) {
    if (step == 2) copy_bytes(grad.d().data, gpu(), grad.h().data, Device{}, grad.h().bytes());
    reducer.start_step(step);
    for (size_t p = params.size(); p-- > 0;) reducer.mark_ready(p);
    reducer.finish();
    EXPECT_TRUE(all_close(floats(reducer.result()), expected_sum(n, comm->size()), 0, 0))
        << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NcclTest, ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace ringtrain::test

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  // No device on any rank: every rank exits 77 (ctest's SKIP_RETURN_CODE; mpiexec passes
  // it on) before a test runs, so a failing test can never be reported as skipped.
  int no_gpu = !ringtrain::test::no_gpu_reason().empty(), any_no_gpu = 0;
  MPI_Allreduce(&no_gpu, &any_no_gpu, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_no_gpu) {
    if (ringtrain::test::world_rank() == 0)
      std::printf("SKIPPED: no CUDA device (%s)\n",
                  no_gpu ? ringtrain::test::no_gpu_reason().c_str() : "not on every rank");
    MPI_Finalize();
    return ringtrain::test::kNoDeviceExit;
  }
  if (ringtrain::test::world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  (void)ringtrain::test::world_size;
  MPI_Finalize();
  return any;
}
