// ZeRO-1 (--zero 1) against the allreduce path on 2, 3 and 4 ranks: the same losses and
// parameters after 200 AdamW steps with gradient clipping in fp32 (within 1e-6 relative;
// how many parameters differ at all is printed), on a model whose parameter count divides
// by none of 2, 3 and 4, so the last shard is uneven; and the shard layout itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "comm/mpi/mpi_communicator.hpp"
#include "comm/shard_layout.hpp"
#include "launch/trainer.hpp"
#include "mpi_test_util.hpp"

namespace ringtrain {
namespace {

TEST(ShardLayout, ContiguousAlignedShardsCoverEveryElementOnce) {
  for (int w = 1; w <= 5; ++w)
    for (int64_t n : {1, 63, 64, 1000, 4099, 100003}) {
      const comm::ShardLayout s(n, w);
      int64_t next = 0;
      for (int r = 0; r < w; ++r) {
        ASSERT_EQ(s.begin(r), next) << "n " << n << " w " << w << " rank " << r;
        ASSERT_GE(s.count(r), 0);
        if (s.end(r) != n) {
          ASSERT_EQ(s.end(r) % comm::ShardLayout::kAlign, 0);
        }
        next = s.end(r);
      }
      ASSERT_EQ(next, n);
      // A bucket's pieces are the shards' intersections with it.
      const int64_t off = n / 3, cnt = n / 2;
      const auto c = s.counts_in(off, cnt);
      int64_t sum = 0;
      for (auto x : c) sum += x;
      ASSERT_EQ(sum, cnt) << "n " << n << " w " << w;
    }
}

TEST(ZeroAcrossRanks, MatchesAllreduceAfter200Steps) {
  const std::string data = test::shared_dataset(2048, 13);
  comm::MpiCommunicator world0(MPI_COMM_WORLD), world1(MPI_COMM_WORLD);
  ASSERT_GE(world0.size(), 2) << "registered at 1 rank, where nothing is sharded";
  launch::TrainConfig cfg;
  cfg.data = data;
  cfg.model_vars = {{"hidden", "33,17", "--hidden"}};
  cfg.precision = DType::f32;
  cfg.steps = 200;
  cfg.threads = 1;
  cfg.global_batch_size = 96;
  cfg.optimizer.name = "adamw";
  cfg.optimizer.lr = 3e-3f;
  cfg.optimizer.weight_decay = 0.01f;
  cfg.grad_clip = 1.0f;
  cfg.bucket_mb = 0.004;  // several buckets, so shards cut across buckets
  cfg.resume = "never";
  launch::Trainer plain(cfg, world0);
  cfg.zero = 1;
  launch::Trainer zero(cfg, world1);
  const int64_t n = plain.model().num_params();
  ASSERT_NE(n % world0.size(), 0) << n << " parameters divide by " << world0.size();
  int64_t loss_bitwise = 0;
  for (int s = 1; s <= 200; ++s) {
    const double a = plain.step_once().loss_sum, b = zero.step_once().loss_sum;
    ASSERT_LE(std::abs(a - b), 1e-6 * std::abs(a))
        << "loss at step " << s << ": " << a << " vs " << b;
    loss_bitwise += a == b;
  }
  const float* a = plain.model().master().as<float>();
  const float* b = zero.model().master().as<float>();
  double diff2 = 0, ref2 = 0;
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - b[i];
    diff2 += d * d;
    ref2 += double(a[i]) * a[i];
    differ += a[i] != b[i];
  }
  EXPECT_GT(ref2, 0.0);
  EXPECT_LE(std::sqrt(diff2 / ref2), 1e-6) << differ << " of " << n << " parameters differ";
  EXPECT_TRUE(test::identical_on_all_ranks(b, size_t(n) * 4)) << "the gathered masters";
  if (world0.rank() == 0)
    std::printf(
        "[zero] %d ranks, %lld params: %lld/200 losses bitwise equal, %lld params differ, "
        "relative difference %.3g\n",
        world0.size(), static_cast<long long>(n), static_cast<long long>(loss_bitwise),
        static_cast<long long>(differ), std::sqrt(diff2 / ref2));
}

}  // namespace
}  // namespace ringtrain
