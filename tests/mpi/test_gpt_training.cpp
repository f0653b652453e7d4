// A GPT (models/gpt-tiny.pbtxt, made small) trained through the real Trainer on a token
// dataset at 2, 3 and 4 ranks (compares ranks, so not registered at 1 rank): the fp32
// masters and the working copy stay bitwise identical on every rank after every step, in
// fp32 and bf16; and W ranks x 24/W windows follow 1 rank x 24 windows (fp32, relative L2
// difference of all parameters <= 1e-5 after 12 steps: only the summation order differs);
// and the accuracy the steps report is correct tokens / tokens, as evaluation counts it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.hpp"
#include "core/rng.hpp"
#include "io/tokens.hpp"
#include "mpi_test_util.hpp"
#include "train/evaluate.hpp"
#include "train/trainer.hpp"

namespace ringtrain {
namespace {

// Rank 0 writes a learnable byte stream (words of a small vocabulary separated by spaces,
// so most next bytes follow from the previous ones) of 6,000 tokens, or exactly `tokens`;
// every rank gets the path.
std::string shared_token_dataset(uint64_t seed, size_t tokens = 0) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char path[256] = {0};
  if (rank == 0) {
    char dir[] = "/tmp/ringtrain-mpi-XXXXXX";
    const std::string d = mkdtemp(dir);
    std::snprintf(path, sizeof path, "%s/tokens.h5", d.c_str());
    const char* words[] = {"def", "return", "self", "import", "class", "lambda", "yield", "for"};
    Rng rng(seed);
    std::vector<uint32_t> stream;
    while (stream.size() < 6000) {
      for (const char* c = words[rng.below(8)]; *c; ++c) stream.push_back(uint32_t(uint8_t(*c)));
      stream.push_back(' ');
    }
    if (tokens > 0) stream.resize(tokens);
    io::write_token_file(path, stream.data(), int64_t(stream.size()), {0}, 256, "bytes", "train");
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

launch::TrainConfig gpt_config(const std::string& data, DType precision) {
  launch::TrainConfig cfg;
  cfg.data = data;
  cfg.model = "gpt-tiny";
  cfg.model_vars = {{"layers", "2", "--set"},
                    {"heads", "2", "--set"},
                    {"width", "32", "--set"},
                    {"context", "16", "--set"}};
  cfg.precision = precision;
  cfg.steps = 12;
  cfg.threads = 1;
  cfg.global_batch_size = 24;  // divides by 1, 2, 3 and 4 ranks
  cfg.resume = "never";
  return cfg;
}

class GptBitwiseAcrossRanks : public testing::TestWithParam<DType> {};

TEST_P(GptBitwiseAcrossRanks, ParametersIdenticalAfterEveryStep) {
  const std::string data = shared_token_dataset(5);
  comm::MpiCommunicator world(MPI_COMM_WORLD);
  ASSERT_GE(world.size(), 2) << "registered at 1 rank, where there is no other rank to compare";
  auto cfg = gpt_config(data, GetParam());
  cfg.optimizer.name = "adamw";
  cfg.optimizer.lr = 3e-3f;
  cfg.grad_clip = 1.0f;  // the norm reduction too
  launch::Trainer trainer(cfg, world);
  Model& model = trainer.model();
  const size_t bytes = size_t(model.num_params()) * 4;
  ASSERT_TRUE(test::identical_on_all_ranks(model.master().data, bytes)) << "after the broadcast";
  double first_loss = 0, last_loss = 0;
  for (int s = 1; s <= 12; ++s) {
    const auto out = trainer.step_once();
    (s == 1 ? first_loss : last_loss) = out.loss_sum / 24;  // nats/token
    ASSERT_TRUE(std::isfinite(out.loss_sum)) << "step " << s;
    ASSERT_TRUE(test::identical_on_all_ranks(model.master().data, bytes)) << "after step " << s;
    const Tensor w = model.work();
    ASSERT_TRUE(test::identical_on_all_ranks(w.data, w.bytes())) << "working copy, step " << s;
  }
  // ln 256 = 5.55 at the start; the words' bytes are learnt within a few steps.
  EXPECT_GT(first_loss, 5.0);
  EXPECT_LT(last_loss, first_loss - 1.0) << "the model should learn the word stream";
}

INSTANTIATE_TEST_SUITE_P(Precisions, GptBitwiseAcrossRanks,
                         testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The steps' correct predictions are tokens (the progress line's and the step records'
// accuracy is correct tokens / tokens, not whole windows): with the model held fixed (the
// linear schedule is at lr 0 after its 12 steps), the counts of the 4 steps of an epoch over
// 96 windows add up to exactly what evaluation counts over the same windows.
TEST(GptTokenAccuracy, StepsCountCorrectTokensAsEvaluationDoes) {
  constexpr int64_t kSeq = 16, kWindows = 96, kBatch = 24;
  const std::string data = shared_token_dataset(7, size_t(kWindows * kSeq + 1));
  comm::MpiCommunicator world(MPI_COMM_WORLD);
  auto cfg = gpt_config(data, DType::f32);
  cfg.optimizer.name = "adamw";
  cfg.optimizer.lr = 3e-3f;
  cfg.optimizer.weight_decay = 0.f;
  cfg.schedule.name = "linear";
  cfg.schedule.decay_steps = 12;  // lr 0 from step 13 on: the model no longer changes
  cfg.steps = 16;
  launch::Trainer trainer(cfg, world);
  for (int s = 1; s <= 12; ++s) trainer.step_once();  // learn enough to be right often
  const std::vector<float> before(
      trainer.model().master().as<float>(),
      trainer.model().master().as<float>() + trainer.model().num_params());
  double correct = 0;
  for (int s = 13; s <= 16; ++s) correct += trainer.step_once().correct;  // one whole epoch
  ASSERT_EQ(0, std::memcmp(before.data(), trainer.model().master().data, before.size() * 4))
      << "the model changed at lr 0";
  io::TokenDataset tokens(data);
  tokens.set_seq_len(kSeq);
  ASSERT_EQ(tokens.num_windows(), kWindows);
  auto backend = kernels::make_cpu_backend(1);
  const launch::EvalResult want =
      launch::evaluate_tokens(trainer.model(), tokens, world, *backend, kBatch / world.size());
  const double want_correct = want.accuracy * double(want.tokens);
  EXPECT_GT(want_correct, 0.1 * double(want.tokens)) << "the model should predict some tokens";
  EXPECT_EQ(correct, std::round(want_correct))
      << "correct tokens over the epoch's steps vs evaluation's over the same windows; "
      << "accuracy " << correct / double(kWindows * kSeq) << " vs " << want.accuracy;
}

TEST(DataParallel, GptWRanksEqualOneRankWithTheSameGlobalBatch) {
  const std::string data = shared_token_dataset(6);
  comm::MpiCommunicator world(MPI_COMM_WORLD);
  ASSERT_GE(world.size(), 2) << "registered at 1 rank, where it compares a trainer with itself";
  comm::MpiCommunicator self(MPI_COMM_SELF);
  // SGD with momentum: the update is linear in the gradient, so the trajectories differ by
  // the gradient's summation order alone (AdamW divides by sqrt(v), which magnifies those
  // rounding differences for parameters whose gradients are near zero).
  auto cfg = gpt_config(data, DType::f32);
  cfg.optimizer.name = "sgd";
  cfg.optimizer.lr = 0.1f;
  cfg.optimizer.momentum = 0.9f;
  launch::Trainer parallel(cfg, world);
  launch::Trainer single(cfg, self);
  for (int s = 0; s < 12; ++s) {
    parallel.step_once();
    single.step_once();
  }
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
  // fp32 rounding of the sums (about 6e-8 relative per addition) grown over 12 steps stays
  // orders of magnitude below 1e-5; another batch order or seed differs by far more (> 1e-3).
  EXPECT_LE(rel, 1e-5) << world.size() << " ranks x " << 24 / world.size()
                       << " vs 1 rank x 24; largest difference at parameter " << worst << ": "
                       << a[worst] << " vs " << b[worst];
  EXPECT_GT(ref2, 0.0);
  if (world.rank() == 0)
    std::printf(
        "  GPT %d ranks x %d vs 1 x 24 windows after 12 steps: relative difference "
        "%.3g, max abs %.3g\n",
        world.size(), 24 / world.size(), rel, max_abs);
}

}  // namespace
}  // namespace ringtrain
