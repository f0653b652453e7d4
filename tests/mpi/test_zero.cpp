// ZeRO-1 (--zero 1) against the allreduce path on 2, 3 and 4 ranks: the same losses and
// parameters after 200 AdamW steps with gradient clipping in fp32 (within 1e-6 relative;
// how many parameters differ at all is printed), also with --grad-accum 2, and in bf16 with
// sharded fp32 masters and a layer kept in fp32 (these two without clipping: AdamW reads
// the summed shard and unscales it as it reads), on a model whose parameter count divides
// by none of 2, 3 and 4, so the last shard is uneven; the bytes per rank of masters and
// optimizer state against shard sizes computed here; the shard layout itself; and the
// reducer's all-gather waited for one bucket at a time, as the next forward waits for it.
// ZeRO-2 (--zero 2): bitwise equal to ZeRO-1 where the reductions are the same (one
// micro-batch, fp32 with clipping and bf16 with sharded masters), within 1e-6 of the allreduce
// path with --grad-accum 2 and clipping (each micro-batch reduce-scattered, the shards summed
// in fp32: another summation order); no whole gradient buffer, the bucket buffers in flight
// bounded, and the fp32 gradient and wire bytes of a shard. ZeRO-3 (--zero 3): within 1e-6 of
// the allreduce path (bitwise losses on 2 ranks), each rank holding its shard only.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>
#include "comm/grad_reducer.hpp"

#include "comm/mpi/mpi_communicator.hpp"
#include "comm/shard_layout.hpp"
#include "core/memory_stats.hpp"
#include "kernels/kernels.hpp"
#include "mpi_test_util.hpp"
#include "train/trainer.hpp"

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

launch::TrainConfig zero_test_config() {
  launch::TrainConfig cfg;
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
  return cfg;
}

// Relative L2 difference of two float arrays, and how many elements differ at all.
struct Diff {
  double rel = 0;
  int64_t differ = 0;
};
template <typename T>
Diff compare(const T* a, const T* b, int64_t n) {
  double diff2 = 0, ref2 = 0;
  Diff d;
  for (int64_t i = 0; i < n; ++i) {
    const double x = double(a[i]), y = double(b[i]);
    diff2 += (x - y) * (x - y);
    ref2 += x * x;
    d.differ += a[i] != b[i];
  }
  d.rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return d;
}

// 200 steps of both; the losses agree within `tol` relative; returns how many are bitwise
// (-1 after the first that is not within tol) and the largest relative difference. Each
// step's forward waits for the all-gather the step before left in flight; at the end the
// last one is waited for, so the weights can be read.
std::pair<int64_t, double> run_both(launch::Trainer& plain, launch::Trainer& zero, double tol) {
  int64_t bitwise = 0;
  double worst = 0;
  for (int s = 1; s <= 200; ++s) {
    const double a = plain.step_once().loss_sum, b = zero.step_once().loss_sum;
    EXPECT_LE(std::abs(a - b), tol * std::abs(a))
        << "loss at step " << s << ": " << a << " vs " << b;
    if (std::abs(a - b) > tol * std::abs(a)) {
      plain.finish_weight_gather();
      zero.finish_weight_gather();
      return {-1, worst};
    }
    worst = std::max(worst, std::abs(a - b) / std::abs(a));
    bitwise += a == b;
  }
  // Both: `plain` is sharded too where a test compares two stages, and its last all-gather
  // may still be in flight on its communication thread.
  plain.finish_weight_gather();
  zero.finish_weight_gather();
  return {bitwise, worst};
}

TEST(ZeroAcrossRanks, MatchesAllreduceAfter200Steps) {
  const std::string data = test::shared_dataset(2048, 13);
  comm::MpiCommunicator world0(MPI_COMM_WORLD), world1(MPI_COMM_WORLD);
  ASSERT_GE(world0.size(), 2) << "registered at 1 rank, where nothing is sharded";
  launch::TrainConfig cfg = zero_test_config();
  cfg.data = data;
  launch::Trainer plain(cfg, world0);
  cfg.zero = 1;
  launch::Trainer zero(cfg, world1);
  const int64_t n = plain.model().num_params();
  ASSERT_NE(n % world0.size(), 0) << n << " parameters divide by " << world0.size();
  const int64_t loss_bitwise = run_both(plain, zero, 1e-6).first;
  ASSERT_GE(loss_bitwise, 0);
  const float* a = plain.model().master().as<float>();
  const float* b = zero.model().master().as<float>();
  const Diff d = compare(a, b, n);
  EXPECT_LE(d.rel, 1e-6) << d.differ << " of " << n << " parameters differ";
  EXPECT_TRUE(test::identical_on_all_ranks(b, size_t(n) * 4)) << "the gathered masters";
  if (world0.rank() == 0)
    std::printf(
        "[zero] fp32, %d ranks, %lld params: %lld/200 losses bitwise equal, %lld params differ, "
        "relative difference %.3g\n",
        world0.size(), static_cast<long long>(n), static_cast<long long>(loss_bitwise),
        static_cast<long long>(d.differ), d.rel);
}

// Gradient accumulation: micro-batches summed locally, one reduce-scatter per step.
TEST(ZeroAcrossRanks, GradAccumMatchesAllreduce) {
  const std::string data = test::shared_dataset(2048, 13);
  comm::MpiCommunicator world0(MPI_COMM_WORLD), world1(MPI_COMM_WORLD);
  ASSERT_GE(world0.size(), 2) << "registered at 1 rank, where nothing is sharded";
  launch::TrainConfig cfg = zero_test_config();
  cfg.data = data;
  cfg.grad_accum = 2;
  cfg.grad_accum_given = true;
  cfg.grad_clip = 0.f;  // the optimizer unscales the sums as it reads them
  launch::Trainer plain(cfg, world0);
  cfg.zero = 1;
  launch::Trainer zero(cfg, world1);
  ASSERT_EQ(zero.grad_accum(), 2);
  const int64_t n = plain.model().num_params();
  const int64_t loss_bitwise = run_both(plain, zero, 1e-6).first;
  ASSERT_GE(loss_bitwise, 0);
  const Diff d = compare(plain.model().master().as<float>(), zero.model().master().as<float>(), n);
  EXPECT_LE(d.rel, 1e-6) << d.differ << " of " << n << " parameters differ";
  if (world0.rank() == 0)
    std::printf(
        "[zero] fp32 --grad-accum 2, %d ranks: %lld/200 losses bitwise, %lld params "
        "differ, relative difference %.3g\n",
        world0.size(), static_cast<long long>(loss_bitwise), static_cast<long long>(d.differ),
        d.rel);
}

std::vector<float> as_floats(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  kernels::host_to_f32(t.data, t.dtype, v.data(), t.numel());
  return v;
}

// bf16: the masters are sharded (fc2 kept in fp32 reads its weights from the fp32 copy, the
// biases too). On 2 ranks the reduce-scatter adds the same two bf16 values as the allreduce
// (one add, one rounding), so the runs agree within 1e-6 (bitwise, in fact). On 3 and 4
// ranks MPI adds the bf16 buckets in another order, each partial sum rounded to bf16, and
// that noise grows over 200 steps: there the losses agree within 2e-2 relative and the
// parameters within 2e-2 relative (what 200 steps of bf16 rounding differences leave).
TEST(ZeroAcrossRanks, Bf16ShardedMastersMatchAllreduce) {
  const std::string data = test::shared_dataset(2048, 13);
  comm::MpiCommunicator world0(MPI_COMM_WORLD), world1(MPI_COMM_WORLD);
  ASSERT_GE(world0.size(), 2) << "registered at 1 rank, where nothing is sharded";
  launch::TrainConfig cfg = zero_test_config();
  cfg.data = data;
  cfg.precision = DType::bf16;
  cfg.layer_precision = "fc2=fp32";
  cfg.grad_clip = 0.f;  // the optimizer unscales the bf16 sums as it reads them
  launch::Trainer plain(cfg, world0);
  cfg.zero = 1;
  launch::Trainer zero(cfg, world1);
  Model& pm = plain.model();
  Model& zm = zero.model();
  const int64_t n = pm.num_params();
  ASSERT_TRUE(zm.masters_sharded());
  ASSERT_LT(zm.master().numel(), n);
  ASSERT_GT(zm.fp32_copy().numel(), 0);
  const double tol = world0.size() == 2 ? 1e-6 : 2e-2;
  const auto [loss_bitwise, loss_worst] = run_both(plain, zero, tol);
  ASSERT_GE(loss_bitwise, 0);
  // This rank's masters against the same slice of the whole ones.
  const Diff dm = compare(pm.master().as<float>() + zm.master_offset(), zm.master().as<float>(),
                          zm.master().numel());
  EXPECT_LE(dm.rel, tol) << dm.differ << " masters of the shard differ";
  // The all-gathered working copy, and every fp32-read parameter against the masters.
  const auto wa = as_floats(pm.work()), wb = as_floats(zm.work());
  const Diff dw = compare(wa.data(), wb.data(), n);
  EXPECT_LE(dw.rel, tol) << dw.differ << " of " << n << " working weights differ";
  int64_t fp32_params = 0;
  for (size_t i = 0; i < zm.params().size(); ++i) {
    const Param& zp = zm.params()[i];
    if (zp.master.data == nullptr) continue;
    ++fp32_params;
    const Diff dp =
        compare(pm.params()[i].master.as<float>(), zp.master.as<float>(), zp.master.numel());
    EXPECT_LE(dp.rel, tol) << zp.name << ": " << dp.differ << " differ";
  }
  EXPECT_EQ(fp32_params, 4) << "fc1.bias, fc2.weight, fc2.bias and fc3.bias are read in fp32";
  EXPECT_TRUE(test::identical_on_all_ranks(zm.work().data, zm.work().bytes()));
  EXPECT_TRUE(test::identical_on_all_ranks(zm.fp32_copy().data, zm.fp32_copy().bytes()));
  if (world0.rank() == 0)
    std::printf(
        "[zero] bf16 sharded masters, %d ranks: %lld/200 losses bitwise equal (largest relative "
        "difference %.3g); rank 0's masters: %lld differ (relative %.3g); working weights: %lld "
        "differ (relative %.3g)\n",
        world0.size(), static_cast<long long>(loss_bitwise), loss_worst,
        static_cast<long long>(dm.differ), dm.rel, static_cast<long long>(dw.differ), dw.rel);
}

// wait_gathered(b) returns once bucket b is all-gathered, with the buckets not yet handed over
// still holding other ranks' old values (what lets the next forward start on the first
// layers' bucket), and blocks while a rank has not yet joined a bucket's all-gather.
TEST(ZeroAcrossRanks, WaitGatheredWaitsForItsBucketOnly) {
  comm::MpiCommunicator world(MPI_COMM_WORLD);
  const std::vector<int64_t> sizes = {301, 7, 499, 64, 713, 5};
  std::vector<std::pair<int64_t, int64_t>> params;
  int64_t n = 0;
  for (int64_t s : sizes) {
    params.push_back({n, s});
    n += s;
  }
  Buffer grad_buf(size_t(n) * 4), work_buf(size_t(n) * 4);
  const Tensor grad(grad_buf.data(), {n}, DType::f32), work(work_buf.data(), {n}, DType::f32);
  comm::ReducerConfig rc;
  rc.bucket_bytes = 2048;  // several buckets, cut across by the shards
  rc.first_bucket_bytes = 64;
  rc.stall_timeout_s = 60;
  rc.shards = comm::ShardLayout(n, world.size());
  comm::GradReducer reducer(world, rc, grad, params);
  const size_t nb = reducer.buckets().size();
  ASSERT_GE(nb, 3u);
  const int64_t lo = rc.shards.begin(world.rank()), hi = rc.shards.end(world.rank());
  float* w = work.as<float>();
  for (int64_t i = 0; i < n; ++i) w[i] = i >= lo && i < hi ? float(i + 1) : -1.f;
  auto bucket_done = [&](size_t b) {  // every element of bucket b holds its owner's value
    const auto& k = reducer.buckets()[b];
    for (int64_t i = k.offset; i < k.offset + k.count; ++i)
      if (w[i] != float(i + 1)) return false;
    return true;
  };
  reducer.start_step(1);
  reducer.finish();  // no gradients this step: nothing to reduce
  reducer.start_gather(work);
  reducer.gather_ready(nb - 1);  // the first layers' bucket only
  reducer.wait_gathered(nb - 1);
  EXPECT_TRUE(bucket_done(nb - 1)) << "bucket " << nb - 1 << " after its wait";
  for (size_t b = 0; b + 1 < nb; ++b) {  // (a bucket inside this rank's shard is complete)
    const auto& k = reducer.buckets()[b];
    if (k.offset < lo || k.offset + k.count > hi) {
      EXPECT_FALSE(bucket_done(b)) << "bucket " << b << " gathered before it was handed over";
    }
  }
  // Rank 1 hands the other buckets over late: the waits on the other ranks must block.
  if (world.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (size_t b = nb - 1; b-- > 0;) reducer.gather_ready(b);
  reducer.wait_gathered(1);
  EXPECT_TRUE(bucket_done(1)) << "bucket 1 after its wait";
  reducer.finish_gather();
  for (size_t b = 0; b < nb; ++b) EXPECT_TRUE(bucket_done(b)) << "bucket " << b;
  EXPECT_TRUE(test::identical_on_all_ranks(w, size_t(n) * 4));
}

// The shard of rank r of W over n elements as the design states it (contiguous, every
// boundary but n a multiple of 64, ceil(n / W) rounded up to 64 per rank).
int64_t expected_shard(int64_t n, int w, int r) {
  const int64_t per = ((n + w - 1) / w + 63) / 64 * 64;
  const int64_t lo = std::min(n, per * r), hi = std::min(n, per * (r + 1));
  return hi - lo;
}

TEST(ZeroAcrossRanks, MastersAndOptimizerBytesAreTheShard) {
  const std::string data = test::shared_dataset(2048, 13);
  comm::MpiCommunicator world(MPI_COMM_WORLD);
  for (DType precision : {DType::f32, DType::bf16}) {
    launch::TrainConfig cfg = zero_test_config();
    cfg.data = data;
    cfg.precision = precision;
    cfg.zero = 1;
    launch::Trainer t(cfg, world);
    const int64_t n = t.model().num_params(), shard = expected_shard(n, world.size(), world.rank());
    const auto m = t.memory_use();
    EXPECT_EQ(m.masters, shard * 4) << dtype_name(precision) << " rank " << world.rank();
    EXPECT_EQ(m.optimizer, shard * 8) << dtype_name(precision) << " (AdamW: two moments)";
    if (precision == DType::bf16) {
      // The buffer itself is the shard, and the working weights are whole, in 16 bit.
      EXPECT_EQ(int64_t(t.model().master().bytes()), shard * 4);
      EXPECT_EQ(m.work, n * 2);
      EXPECT_EQ(m.fp32_read, (33 + 17 + 4) * 4) << "the three biases";
    } else {
      EXPECT_EQ(m.masters + m.work, n * 4) << "fp32: the shard is part of the working weights";
    }
    // Bytes on the wire equal the allreduce's: (W-1)/W of the buffer each way.
    const auto b = t.wire_bytes();
    const double f = double(world.size() - 1) / world.size();
    const double es = double(dtype_size(precision));
    EXPECT_DOUBLE_EQ(b.reduce, f * double(n) * es);
    EXPECT_DOUBLE_EQ(b.gather, f * double(n) * es);
  }
}

// The replicated strategy's report: every rank holds everything, and the buckets are
// allreduced, 2(W-1)/W of the buffer on the wire, nothing gathered.
TEST(ZeroAcrossRanks, ReplicatedHoldsEverythingAndAllreduces) {
  const std::string data = test::shared_dataset(2048, 13);
  comm::MpiCommunicator world(MPI_COMM_WORLD);
  for (DType precision : {DType::f32, DType::bf16}) {
    launch::TrainConfig cfg = zero_test_config();
    cfg.data = data;
    cfg.precision = precision;
    launch::Trainer t(cfg, world);
    const int64_t n = t.model().num_params(), es = int64_t(dtype_size(precision));
    const auto m = t.memory_use();
    EXPECT_EQ(m.masters, n * 4) << dtype_name(precision) << " rank " << world.rank();
    EXPECT_EQ(m.optimizer, n * 8) << dtype_name(precision) << " (AdamW: two moments)";
    EXPECT_EQ(m.work, precision == DType::f32 ? 0 : n * 2) << "fp32: the masters are the weights";
    EXPECT_EQ(m.fp32_read, 0) << dtype_name(precision);
    // The compute-dtype gradient, and in bf16 (clipping: the optimizer does not unscale)
    // the fp32 gradient too.
    EXPECT_EQ(m.grads, n * es + (precision == DType::f32 ? 0 : n * 4)) << dtype_name(precision);
    const auto b = t.wire_bytes();
    const double f = double(world.size() - 1) / world.size();
    EXPECT_DOUBLE_EQ(b.reduce, 2 * f * double(n) * double(es));
    EXPECT_EQ(b.gather, 0.0);
    EXPECT_EQ(b.gather_fp32, 0.0);
  }
}

// Steps three trainers `steps` times; fails at the first step where b's loss is not within
// `tol_ab` of a's or c's is not within `tol_bc` of b's. Returns how many of b's and of c's
// losses were bitwise a's and b's.
std::pair<int64_t, int64_t> run_three(launch::Trainer& a, launch::Trainer& b, launch::Trainer& c,
                                      double tol_ab, double tol_bc, int steps = 200) {
  int64_t ab = 0, bc = 0;
  for (int s = 1; s <= steps; ++s) {
    const double la = a.step_once().loss_sum, lb = b.step_once().loss_sum;
    const double lc = c.step_once().loss_sum;
    const bool ok_ab = std::abs(la - lb) <= tol_ab * std::abs(la);
    const bool ok_bc = std::abs(lb - lc) <= tol_bc * std::abs(lb);
    EXPECT_TRUE(ok_ab) << "step " << s << ": " << la << " vs " << lb;
    EXPECT_TRUE(ok_bc) << "step " << s << ": " << lb << " vs " << lc;
    if (!ok_ab || !ok_bc) break;
    ab += la == lb;
    bc += lb == lc;
  }
  b.finish_weight_gather();
  c.finish_weight_gather();
  return {ab, bc};
}

TEST(Zero2AcrossRanks, BitwiseZero1AndWithin1e6OfAllreduce) {
  const std::string data = test::shared_dataset(2048, 13);
  comm::MpiCommunicator w0(MPI_COMM_WORLD), w1(MPI_COMM_WORLD), w2(MPI_COMM_WORLD);
  launch::TrainConfig cfg = zero_test_config();
  cfg.data = data;
  launch::Trainer plain(cfg, w0);
  cfg.zero = 1;
  launch::Trainer z1(cfg, w1);
  cfg.zero = 2;
  launch::Trainer z2(cfg, w2);
  const int64_t n = plain.model().num_params();
  EXPECT_EQ(z2.model().grad().data, nullptr) << "no whole gradient buffer";
  const auto [loss01, loss12] = run_three(plain, z1, z2, 1e-6, 0.0);
  const float* m1 = z1.model().master().as<float>();
  const float* m2 = z2.model().master().as<float>();
  EXPECT_EQ(compare(m1, m2, n).differ, 0) << "--zero 2 against --zero 1";
  const Diff d = compare(plain.model().master().as<float>(), m2, n);
  EXPECT_LE(d.rel, 1e-6) << d.differ << " of " << n << " parameters differ from --zero 0";
  if (w0.rank() == 0)
    std::printf(
        "[zero2] fp32 clip, %d ranks: %lld/200 losses bitwise --zero 1, %lld/200 --zero 0 "
        "bitwise --zero 1; against --zero 0: %lld params differ, relative %.3g\n",
        w0.size(), static_cast<long long>(loss12), static_cast<long long>(loss01),
        static_cast<long long>(d.differ), d.rel);
}

// --grad-accum 2 with clipping: --zero 0 sums the micro-batches in fp32 and allreduces once;
// --zero 2 reduce-scatters each micro-batch and adds the two shard sums in fp32.
TEST(Zero2AcrossRanks, GradAccumAndClipWithin1e6OfAllreduce) {
  const std::string data = test::shared_dataset(2048, 13);
  comm::MpiCommunicator w0(MPI_COMM_WORLD), w2(MPI_COMM_WORLD);
  launch::TrainConfig cfg = zero_test_config();
  cfg.data = data;
  cfg.grad_accum = 2;
  cfg.grad_accum_given = true;
  launch::Trainer plain(cfg, w0);
  cfg.zero = 2;
  launch::Trainer z2(cfg, w2);
  ASSERT_EQ(z2.grad_accum(), 2);
  const int64_t n = plain.model().num_params();
  const auto [loss_bitwise, worst] = run_both(plain, z2, 1e-6);
  ASSERT_GE(loss_bitwise, 0);
  const Diff d = compare(plain.model().master().as<float>(), z2.model().master().as<float>(), n);
  EXPECT_LE(d.rel, 1e-6) << d.differ << " of " << n << " parameters differ";
  EXPECT_TRUE(test::identical_on_all_ranks(z2.model().master().data, size_t(n) * 4));
  // Each micro-batch is reduce-scattered: twice ZeRO-1's reduction bytes.
  const double f = double(w0.size() - 1) / w0.size();
  EXPECT_DOUBLE_EQ(z2.wire_bytes().reduce, 2 * f * double(n) * 4);
  if (w0.rank() == 0)
    std::printf(
        "[zero2] fp32 --grad-accum 2 clip, %d ranks: %lld/200 losses bitwise --zero 0 (largest "
        "relative difference %.3g), %lld params differ, relative %.3g\n",
        w0.size(), static_cast<long long>(loss_bitwise), worst, static_cast<long long>(d.differ),
        d.rel);
}

// bf16 with sharded masters and a layer in fp32: the bf16 buckets are reduce-scattered as
// ZeRO-1 does and the sums converted to fp32 exactly, so the runs are bitwise equal.
TEST(Zero2AcrossRanks, Bf16BitwiseZero1) {
  const std::string data = test::shared_dataset(2048, 13);
  comm::MpiCommunicator w1(MPI_COMM_WORLD), w2(MPI_COMM_WORLD);
  launch::TrainConfig cfg = zero_test_config();
  cfg.data = data;
  cfg.precision = DType::bf16;
  cfg.layer_precision = "fc2=fp32";
  cfg.zero = 1;
  launch::Trainer z1(cfg, w1);
  cfg.zero = 2;
  launch::Trainer z2(cfg, w2);
  const auto [loss_bitwise, worst] = run_both(z1, z2, 0.0);
  EXPECT_EQ(loss_bitwise, 200) << "largest relative difference " << worst;
  const Model &m1 = z1.model(), &m2 = z2.model();
  EXPECT_EQ(compare(m1.master().as<float>(), m2.master().as<float>(), m1.master().numel()).differ,
            0);
  const auto a = as_floats(m1.work()), b = as_floats(m2.work());
  EXPECT_EQ(compare(a.data(), b.data(), m1.num_params()).differ, 0);
}

// --no-overlap: each bucket reduced on the main thread as soon as it is complete, one bucket
// buffer at a time; the same buckets in the same order, so bitwise the overlapped run.
TEST(Zero2AcrossRanks, NoOverlapBitwiseOverlapped) {
  const std::string data = test::shared_dataset(2048, 13);
  comm::MpiCommunicator w0(MPI_COMM_WORLD), w1(MPI_COMM_WORLD);
  launch::TrainConfig cfg = zero_test_config();
  cfg.data = data;
  cfg.grad_accum = 2;
  cfg.grad_accum_given = true;
  cfg.zero = 2;
  cfg.bucket_mb = 1e-4;  // a bucket per layer
  launch::Trainer overlapped(cfg, w0);
  cfg.overlap = false;
  launch::Trainer sequential(cfg, w1);
  const auto [loss_bitwise, worst] = run_both(overlapped, sequential, 0.0);
  EXPECT_EQ(loss_bitwise, 200) << "largest relative difference " << worst;
  const Model &a = overlapped.model(), &b = sequential.model();
  EXPECT_EQ(compare(a.master().as<float>(), b.master().as<float>(), a.num_params()).differ, 0);
  // One bucket at a time: at most fc1's, the largest.
  EXPECT_LE(sequential.reducer().peak_bucket_bytes(), (64 * 33 + 33) * 4);
}

TEST(Zero2AcrossRanks, GradientIsTheShardAndBucketsInFlight) {
  const std::string data = test::shared_dataset(2048, 13);
  comm::MpiCommunicator world(MPI_COMM_WORLD);
  for (DType precision : {DType::f32, DType::bf16}) {
    launch::TrainConfig cfg = zero_test_config();
    cfg.data = data;
    cfg.precision = precision;
    cfg.model_vars = {{"hidden", "33,17,9,7,5", "--hidden"}};
    cfg.bucket_mb = 1e-4;  // a bucket per layer: 6, more than the cap
    cfg.steps = 3;
    cfg.zero = 2;
    launch::Trainer t(cfg, world);
    for (int s = 0; s < 3; ++s) t.step_once();
    t.finish_weight_gather();
    const int64_t n = t.model().num_params(), shard = expected_shard(n, world.size(), world.rank());
    const int64_t es = int64_t(dtype_size(precision));
    const auto m = t.memory_use();
    EXPECT_EQ(m.grads, shard * 4) << dtype_name(precision) << ": the fp32 gradient's shard only";
    EXPECT_EQ(m.masters, shard * 4) << dtype_name(precision);
    EXPECT_EQ(m.optimizer, shard * 8) << dtype_name(precision);
    const comm::GradReducer& r = t.reducer();
    ASSERT_EQ(r.buckets().size(), 6u);
    std::vector<int64_t> counts;  // the 3 largest buckets: the layers fc1, fc2, fc3
    for (const auto& k : r.buckets()) counts.push_back(k.count);
    std::sort(counts.rbegin(), counts.rend());
    const int64_t largest = counts[0];
    EXPECT_EQ(counts[0] + counts[1] + counts[2], (64 * 33 + 33) + (33 * 17 + 17) + (17 * 9 + 9));
    EXPECT_EQ(m.grad_buckets, (counts[0] + counts[1] + counts[2]) * es);
    // What existed at once: at least a bucket, at most the cap, never the whole gradient.
    EXPECT_GE(r.peak_bucket_bytes(), largest * es);
    EXPECT_LE(r.peak_bucket_bytes(), m.grad_buckets);
    EXPECT_LT(r.peak_bucket_bytes(), n * es) << dtype_name(precision);
    const auto b = t.wire_bytes();
    const double f = double(world.size() - 1) / world.size();
    EXPECT_DOUBLE_EQ(b.reduce, f * double(n) * double(es));
    EXPECT_DOUBLE_EQ(b.allreduce, 2 * b.reduce) << "a reduce-scatter is half an allreduce";
  }
}

// ZeRO-3 (--zero 3): 200 steps with clipping against the allreduce path (within 1e-6; the
// losses bitwise on 2 ranks, printed), each rank's shard of the masters against the same
// range of the replicated run's; between steps no whole weights, no gathered unit and no
// gradient buffer exist (every working-weight view empty, the `gathered` category at 0 B).
TEST(Zero3AcrossRanks, MatchesAllreduceAndHoldsOnlyItsShard) {
  const std::string data = test::shared_dataset(2048, 13);
  comm::MpiCommunicator world0(MPI_COMM_WORLD), world1(MPI_COMM_WORLD);
  ASSERT_GE(world0.size(), 2) << "registered at 1 rank, where nothing is sharded";
  launch::TrainConfig cfg = zero_test_config();
  cfg.data = data;
  launch::Trainer plain(cfg, world0);
  cfg.zero = 3;
  launch::Trainer zero(cfg, world1);
  const auto [loss_bitwise, worst] = run_both(plain, zero, 1e-6);
  ASSERT_GE(loss_bitwise, 0);
  if (world0.size() == 2) {
    EXPECT_EQ(loss_bitwise, 200) << "2 ranks: the same sums as --zero 0";
  }
  Model& m = zero.model();
  const int64_t n = m.num_params(), shard = expected_shard(n, world0.size(), world0.rank());
  ASSERT_TRUE(m.parameters_sharded());
  ASSERT_EQ(m.master().numel(), shard);
  const Diff d = compare(plain.model().master().as<float>() + m.master_offset(),
                         m.master().as<float>(), shard);
  EXPECT_LE(d.rel, 1e-6) << d.differ << " of " << shard << " parameters of the shard differ";
  for (const Param& p : m.params())
    EXPECT_EQ(p.work.data, nullptr) << p.name << ": a gathered view left after the step";
  EXPECT_EQ(m.grad().data, nullptr) << "no whole gradient buffer";
  EXPECT_EQ(memory_counts(false).at(MemCategory::gathered), 0) << "a gathered unit still held";
  EXPECT_GT(memory_counts(false).peak_of(MemCategory::gathered), 0) << "nothing was gathered";
  const auto mu = zero.memory_use();
  EXPECT_EQ(mu.masters, shard * 4);
  EXPECT_EQ(mu.optimizer, shard * 8);
  EXPECT_EQ(mu.grads, shard * 4);
  EXPECT_EQ(mu.work, 0) << "fp32: the masters' shard is the working shard";
  if (world0.rank() == 0)
    std::printf(
        "[zero3] fp32, %d ranks: %lld/200 losses bitwise (worst relative %.3g), %lld of the "
        "shard's %lld params differ, relative difference %.3g\n",
        world0.size(), static_cast<long long>(loss_bitwise), worst,
        static_cast<long long>(d.differ), static_cast<long long>(shard), d.rel);
}

}  // namespace
}  // namespace ringtrain
