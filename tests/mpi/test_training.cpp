// Data-parallel training through the real Trainer on 2, 3 and 4 ranks (these tests compare
// ranks with each other or with one rank, so tests/mpi/CMakeLists.txt does not register them
// at 1 rank): parameters stay bitwise identical on every rank after every step, in every
// precision; and W ranks with a per-rank batch of 96/W follow the same trajectory as 1 rank
// with a batch of 96 (fp32, relative difference <= 1e-5 after 20 steps: summation order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "comm/mpi/mpi_communicator.hpp"
#include "mpi_test_util.hpp"
#include "train/trainer.hpp"

namespace ringtrain {
namespace {

launch::TrainConfig small_config(const std::string& data, DType precision) {
  launch::TrainConfig cfg;
  cfg.data = data;
  cfg.model_vars = {{"hidden", "32,16", "--hidden"}};
  cfg.precision = precision;
  cfg.steps = 20;
  cfg.threads = 1;
  cfg.optimizer.name = "sgd";
  cfg.optimizer.lr = 0.05f;
  cfg.optimizer.momentum = 0.9f;
  cfg.resume = "never";
  return cfg;
}

class BitwiseAcrossRanks : public testing::TestWithParam<DType> {};

TEST_P(BitwiseAcrossRanks, ParametersIdenticalAfterEveryStep) {
  const std::string data = test::shared_dataset(1024, 7);
  comm::MpiCommunicator world(MPI_COMM_WORLD);
  ASSERT_GE(world.size(), 2) << "registered at 1 rank, where there is no other rank to compare";
  auto cfg = small_config(data, GetParam());
  cfg.global_batch_size = 96;  // divides by 1, 2, 3 and 4 ranks
  cfg.optimizer.name = "adamw";
  cfg.optimizer.lr = 1e-2f;
  cfg.grad_clip = 1.0f;  // exercises the norm reduction too
  launch::Trainer trainer(cfg, world);
  Model& model = trainer.model();
  const size_t bytes = size_t(model.num_params()) * 4;
  ASSERT_TRUE(test::identical_on_all_ranks(model.master().data, bytes)) << "after the broadcast";
  double first_loss = 0, last_loss = 0;
  for (int s = 1; s <= 20; ++s) {
    auto out = trainer.step_once();
    (s == 1 ? first_loss : last_loss) = out.loss_sum / 96;
    ASSERT_TRUE(test::identical_on_all_ranks(model.master().data, bytes)) << "after step " << s;
    const Tensor w = model.work();
    ASSERT_TRUE(test::identical_on_all_ranks(w.data, w.bytes())) << "working copy, step " << s;
  }
  EXPECT_LT(last_loss, first_loss) << "the model should learn the synthetic task";
}

INSTANTIATE_TEST_SUITE_P(Precisions, BitwiseAcrossRanks,
                         testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The convolutional models: per-rank dropout masks and per-rank BatchNorm statistics, yet
// the summed gradients keep the parameters bitwise identical on every rank.
class ConvModelsAcrossRanks : public testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(ConvModelsAcrossRanks, ParametersIdenticalAfterEveryStep) {
  const auto& [name, precision] = GetParam();
  const std::string data = test::shared_dataset(1024, 9);
  comm::MpiCommunicator world(MPI_COMM_WORLD);
  ASSERT_GE(world.size(), 2) << "registered at 1 rank, where there is no other rank to compare";
  auto cfg = small_config(data, precision);
  cfg.model = name;
  cfg.model_vars.clear();  // small_config's --hidden is the mlp's
  if (name == "resnet") cfg.model_vars.push_back({"width", "4", "--width"});
  cfg.global_batch_size = 48;
  cfg.optimizer.name = "adamw";
  cfg.optimizer.lr = 1e-2f;
  launch::Trainer trainer(cfg, world);
  Model& model = trainer.model();
  const size_t bytes = size_t(model.num_params()) * 4;
  double first_loss = 0, last_loss = 0;
  for (int s = 1; s <= 12; ++s) {
    auto out = trainer.step_once();
    (s == 1 ? first_loss : last_loss) = out.loss_sum / 48;
    ASSERT_TRUE(test::identical_on_all_ranks(model.master().data, bytes)) << "after step " << s;
  }
  EXPECT_LT(last_loss, first_loss) << name << " should learn the synthetic task";
}

INSTANTIATE_TEST_SUITE_P(Models, ConvModelsAcrossRanks,
                         testing::Combine(testing::Values("cnn", "resnet"),
                                          testing::Values(DType::f32, DType::bf16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

// The global batch of the comparison: divides by 2, 3 and 4 ranks.
constexpr int kGlobal = 96;

TEST(DataParallel, WRanksEqualOneRankWithTheSameGlobalBatch) {
  const std::string data = test::shared_dataset(2048, 11);
  comm::MpiCommunicator world(MPI_COMM_WORLD);
  // At 1 rank both trainers would be the same computation: nothing would be compared.
  ASSERT_GE(world.size(), 2) << "registered at 1 rank, where it compares a trainer with itself";
  ASSERT_EQ(kGlobal % world.size(), 0) << kGlobal << " samples do not split over " << world.size();
  comm::MpiCommunicator self(MPI_COMM_SELF);
  auto cfg = small_config(data, DType::f32);
  cfg.batch_size = kGlobal / world.size();
  launch::Trainer parallel(cfg, world);
  cfg.batch_size = kGlobal;
  launch::Trainer single(cfg, self);
  for (int s = 0; s < 20; ++s) {
    parallel.step_once();
    single.step_once();
  }
  // Relative difference of the whole parameter vector, ||a - b|| / ||b||: elementwise
  // ratios blow up on parameters that pass through zero, where only the absolute error
  // (reported below) is meaningful.
  const float* a = parallel.model().master().as<float>();
  const float* b = single.model().master().as<float>();
  double diff2 = 0, ref2 = 0, max_abs = 0;
  int64_t worst = 0;
  for (int64_t i = 0; i < parallel.model().num_params(); ++i) {
    const double d = double(a[i]) - b[i];
    diff2 += d * d;
    ref2 += double(b[i]) * b[i];
    if (std::abs(d) > max_abs) {
      max_abs = std::abs(d);
      worst = i;
    }
  }
  const double rel = std::sqrt(diff2 / ref2);
  EXPECT_LE(rel, 1e-5) << world.size() << " ranks x " << kGlobal / world.size() << " vs 1 rank x "
                       << kGlobal << "; largest difference at parameter " << worst << ": "
                       << a[worst] << " vs " << b[worst];
  EXPECT_GT(ref2, 0.0);
  if (world.rank() == 0)
    std::printf(
        "  %d ranks x %d vs 1 x %d after 20 steps: relative difference %.3g, max abs %.3g\n",
        world.size(), kGlobal / world.size(), kGlobal, rel, max_abs);
}

}  // namespace
}  // namespace ringtrain
