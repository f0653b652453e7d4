// The MPI communicator on 1, 2, 3 and 4 ranks: sums in every dtype (exact where the values
// make it exact, fp32-add-then-round for fp16/bf16), identical results on all ranks,
// broadcast, allgather, and the node layout.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "comm/mpi/mpi_communicator.hpp"
#include "core/rng.hpp"
#include "mpi_test_util.hpp"

namespace ringtrain {
namespace {

TEST(MpiComm, LayoutIsConsistent) {
  comm::MpiCommunicator c(MPI_COMM_WORLD);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(c.size(), size);
  EXPECT_EQ(c.num_nodes(), 1) << "all test ranks run on this machine";
  EXPECT_EQ(c.local_size(), size);
  EXPECT_EQ(c.local_rank(), c.rank());
}

TEST(MpiComm, IntegerAndFloatSumsAreExact) {
  comm::MpiCommunicator c(MPI_COMM_WORLD);
  const int w = c.size(), r = c.rank();
  std::vector<int64_t> iv(1000);
  std::vector<float> fv(1000);
  for (int i = 0; i < 1000; ++i) {
    iv[size_t(i)] = i * (r + 1);
    fv[size_t(i)] = float(i % 97) * float(r + 1);
  }
  c.allreduce(iv.data(), 1000, DType::i64, comm::ReduceOp::sum);
  c.allreduce(fv.data(), 1000, DType::f32, comm::ReduceOp::sum);
  const int tri = w * (w + 1) / 2;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(iv[size_t(i)], int64_t(i) * tri) << "at index " << i;
    ASSERT_EQ(fv[size_t(i)], float(i % 97) * float(tri)) << "at index " << i;
  }
  int64_t mx = r;
  c.allreduce(&mx, 1, DType::i64, comm::ReduceOp::max);
  EXPECT_EQ(mx, w - 1);
}

// fp16/bf16 sums: small integers add exactly in both formats, so the result is exact.
class Sum16 : public testing::TestWithParam<DType> {};

TEST_P(Sum16, SmallIntegersSumExactly) {
  const DType t = GetParam();
  comm::MpiCommunicator c(MPI_COMM_WORLD);
  const int n = 4099;  // odd size, larger than one internal segment of small messages
  std::vector<uint16_t> v(n);
  auto enc = [&](float f) { return t == DType::f16 ? float_to_half(f) : float_to_bf16(f); };
  auto dec = [&](uint16_t b) { return t == DType::f16 ? half_to_float(b) : bf16_to_float(b); };
  for (int i = 0; i < n; ++i) v[size_t(i)] = enc(float((i % 13) - 6) * float(c.rank() + 1));
  c.allreduce(v.data(), n, t, comm::ReduceOp::sum);
  const int tri = c.size() * (c.size() + 1) / 2;
  for (int i = 0; i < n; ++i)
    ASSERT_EQ(dec(v[size_t(i)]), float((i % 13) - 6) * float(tri)) << "at index " << i;
}

TEST_P(Sum16, RandomValuesMatchFp32SumAndAreIdenticalOnAllRanks) {
  const DType t = GetParam();
  comm::MpiCommunicator c(MPI_COMM_WORLD);
  const int n = 100000;
  auto enc = [&](float f) { return t == DType::f16 ? float_to_half(f) : float_to_bf16(f); };
  auto dec = [&](uint16_t b) { return t == DType::f16 ? half_to_float(b) : bf16_to_float(b); };
  // Every rank can regenerate every rank's contribution from its seed.
  auto contribution = [&](int rank, int i) {
    Rng rng(mix_seed(1234, uint64_t(rank) * 1000003u + uint64_t(i)));
    return enc(rng.uniform() * 2.f - 1.f);
  };
  std::vector<uint16_t> v(n);
  for (int i = 0; i < n; ++i) v[size_t(i)] = contribution(c.rank(), i);
  c.allreduce(v.data(), n, t, comm::ReduceOp::sum);
  EXPECT_TRUE(test::identical_on_all_ranks(v.data(), v.size() * 2));
  // Each of the w-1 adds rounds once to 16 bits: the error is bounded by (w-1) half-ulps
  // of the largest partial sum, at most w in magnitude.
  const double ulp = t == DType::f16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
  for (int i = 0; i < n; ++i) {
    double exact = 0;
    for (int r = 0; r < c.size(); ++r) exact += dec(contribution(r, i));
    const double tol = (c.size() - 1) * ulp * std::max(1.0, double(c.size())) + 1e-12;
    ASSERT_NEAR(dec(v[size_t(i)]), exact, tol) << "at index " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Sum16, testing::Values(DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(MpiComm, BroadcastAndAllgather) {
  comm::MpiCommunicator c(MPI_COMM_WORLD);
  std::vector<float> b(12345, float(c.rank()));
  const int root = c.size() - 1;
  c.broadcast(b.data(), int64_t(b.size()), DType::f32, root);
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], float(root)) << "at index " << i;
  int32_t mine[2] = {c.rank(), 10 * c.rank()};
  std::vector<int32_t> all(size_t(2 * c.size()));
  c.allgather(mine, all.data(), 2, DType::i32);
  for (int r = 0; r < c.size(); ++r) {
    EXPECT_EQ(all[size_t(2 * r)], r);
    EXPECT_EQ(all[size_t(2 * r + 1)], 10 * r);
  }
}

}  // namespace
}  // namespace ringtrain
