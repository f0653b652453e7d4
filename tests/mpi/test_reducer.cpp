// The bucketed gradient allreduce on 1-4 ranks: flat and hierarchical communicators x wire
// dtype x gradient dtype, parameter layouts with sizes not divisible by the rank count,
// one-element and empty parameters, buckets of a few bytes and one bucket larger than the
// model; hierarchical with RINGTRAIN_RANKS_PER_NODE=2 equals flat (on 2 and 4 ranks);
// overlapped and non-overlapped training give bitwise identical parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <tuple>
#include <vector>

#include "comm/grad_reducer.hpp"
#include "comm/hierarchical.hpp"
#include "mpi_test_util.hpp"
#include "train/trainer.hpp"

namespace ringtrain {
namespace {

using Case = std::tuple<std::string, DType, DType, int64_t>;  // comm, grad, wire, bucket bytes

class Reducer : public testing::TestWithParam<Case> {};

std::unique_ptr<comm::Communicator> make_comm(const std::string& kind) {
  if (kind == "hierarchical")
    return std::make_unique<comm::HierarchicalCommunicator>(MPI_COMM_WORLD);
  return std::make_unique<comm::MpiCommunicator>(MPI_COMM_WORLD);
}

float load(const Tensor& t, int64_t i) {
  if (t.dtype == DType::f32) return t.as<float>()[i];
  const uint16_t b = t.as<uint16_t>()[i];
  return t.dtype == DType::f16 ? half_to_float(b) : bf16_to_float(b);
}

TEST_P(Reducer, SumsEveryBucketOnEveryRank) {
  const auto& [kind, gdt, wire, bucket_bytes] = GetParam();
  auto c = make_comm(kind);
  // Parameters: odd sizes, a single element, an empty one, one of several buckets' worth.
  const std::vector<int64_t> sizes = {7, 1, 0, 1001, 3, 4099, 13};
  std::vector<std::pair<int64_t, int64_t>> params;
  int64_t n = 0;
  for (int64_t s : sizes) {
    params.push_back({n, s});
    n += s;
  }
  Buffer buf(size_t(n) * dtype_size(gdt));
  Tensor grad(buf.data(), {n}, gdt);
  comm::ReducerConfig rc;
  rc.wire = wire;
  rc.bucket_bytes = bucket_bytes;
  // Tiny first bucket, except in the one-bucket case.
  rc.first_bucket_bytes =
      bucket_bytes >= (int64_t(1) << 30) ? bucket_bytes : std::min<int64_t>(bucket_bytes, 16);
  rc.stall_timeout_s = 60;
  comm::GradReducer reducer(*c, rc, grad, params);
  // Values whose sums over up to 4 ranks are exact in fp16 and bf16: small integers.
  auto value = [](int rank, int64_t i) { return float((i % 5) + 1) * float(rank + 1); };
  for (int step = 1; step <= 2; ++step) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = value(c->rank(), i) * float(step);
      if (gdt == DType::f32)
        grad.as<float>()[i] = v;
      else
        grad.as<uint16_t>()[i] = gdt == DType::f16 ? float_to_half(v) : float_to_bf16(v);
    }
    reducer.start_step(step);
    for (size_t p = params.size(); p-- > 0;) reducer.mark_ready(p);  // as backward does
    reducer.finish();
    const Tensor r = reducer.result();
    ASSERT_EQ(r.dtype, wire);
    const float tri = float(c->size() * (c->size() + 1) / 2);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(load(r, i), float((i % 5) + 1) * tri * float(step))
          << "at element " << i << ", step " << step << ", " << reducer.buckets().size()
          << " buckets";
  }
  if (bucket_bytes >= (1 << 30)) {
    EXPECT_EQ(reducer.buckets().size(), 1u) << "one bucket for the model";
  }
  if (bucket_bytes <= 64) {
    EXPECT_GE(reducer.buckets().size(), 4u) << "tiny buckets: most parameters alone";
  }
}

INSTANTIATE_TEST_SUITE_P(All, Reducer,
                         testing::Combine(testing::Values("mpi", "hierarchical"),
                                          testing::Values(DType::f32, DType::f16, DType::bf16),
                                          testing::Values(DType::f32, DType::f16, DType::bf16),
                                          testing::Values(int64_t(8), int64_t(4096),
                                                          int64_t(1) << 30)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_grad_" +
                                  dtype_name(std::get<1>(info.param)) + "_wire_" +
                                  dtype_name(std::get<2>(info.param)) + "_bucket" +
                                  std::to_string(std::get<3>(info.param));
                         });

TEST(Hierarchical, TwoRanksPerNodeEqualsFlat) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Registered at 2 and 4 ranks only (tests/mpi/CMakeLists.txt): nodes of 2 ranks.
  ASSERT_EQ(size % 2, 0) << "registered at " << size << " ranks; it needs an even number";
  setenv("RINGTRAIN_RANKS_PER_NODE", "2", 1);
  comm::HierarchicalCommunicator h(MPI_COMM_WORLD);
  unsetenv("RINGTRAIN_RANKS_PER_NODE");
  comm::MpiCommunicator flat(MPI_COMM_WORLD);
  EXPECT_EQ(h.num_nodes(), size / 2);
  EXPECT_EQ(h.local_size(), 2);
  EXPECT_EQ(h.local_rank(), h.rank() % 2);
  for (int64_t n : {int64_t(1), int64_t(3), int64_t(1001), int64_t(65537)}) {
    std::vector<float> a(static_cast<size_t>(n)), b;
    Rng rng(mix_seed(5, uint64_t(h.rank())));
    for (auto& v : a) v = rng.uniform() - 0.5f;
    b = a;
    std::vector<int64_t> ia(a.size());
    for (size_t i = 0; i < a.size(); ++i) ia[i] = int64_t(i) * (h.rank() + 1);
    std::vector<int64_t> ib = ia;
    h.allreduce(a.data(), n, DType::f32, comm::ReduceOp::sum);
    flat.allreduce(b.data(), n, DType::f32, comm::ReduceOp::sum);
    h.allreduce(ia.data(), n, DType::i64, comm::ReduceOp::sum);
    flat.allreduce(ib.data(), n, DType::i64, comm::ReduceOp::sum);
    EXPECT_EQ(ia, ib) << "integers: exactly equal, n=" << n;
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(a[i], b[i], 1e-6) << "fp32 at " << i << ", n=" << n;  // summation order
    EXPECT_TRUE(test::identical_on_all_ranks(a.data(), a.size() * 4)) << "n=" << n;
  }
}

TEST(Overlap, OverlappedAndSequentialTrainingAreBitwiseIdentical) {
  const std::string data = test::shared_dataset(1024, 21);
  comm::MpiCommunicator world(MPI_COMM_WORLD);
  for (DType wire : {DType::f32, DType::bf16}) {
    launch::TrainConfig cfg;
    cfg.data = data;
    cfg.model_vars = {{"hidden", "48,32", "--hidden"}};
    cfg.precision = DType::f16;
    cfg.batch_size = 16;
    cfg.steps = 12;
    cfg.threads = 1;
    cfg.resume = "never";
    cfg.wire_dtype = wire;
    cfg.wire_dtype_given = true;
    cfg.bucket_mb = 0.002;  // a few KiB: several buckets
    cfg.overlap = true;
    launch::Trainer a(cfg, world);
    cfg.overlap = false;
    launch::Trainer b(cfg, world);
    for (int s = 0; s < 12; ++s) {
      a.step_once();
      b.step_once();
    }
    const size_t bytes = size_t(a.model().num_params()) * 4;
    EXPECT_EQ(std::memcmp(a.model().master().data, b.model().master().data, bytes), 0)
        << "wire " << dtype_name(wire);
    EXPECT_TRUE(test::identical_on_all_ranks(a.model().master().data, bytes));
  }
}

}  // namespace
}  // namespace ringtrain
