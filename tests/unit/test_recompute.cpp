// Activation recomputation (Model::set_recompute, --recompute blocks): a model that frees each
// repeat body's activations after forward and runs that forward again in backward computes
// bitwise what the same model computes without it -- logits, parameter gradients and
// BatchNorm's running averages -- over several steps with dropout (each step's masks), with
// an evaluation forward between steps; on GPT (dropout > 0, fp32 and bf16), ResNet (nested
// repeats, BatchNorm inside the bodies) and the MLP. The executor's held activation bytes at
// their peak drop by at least half the number of repeat bodies on GPT, and drop on ResNet (the
// MLP's bodies are one node each, whose output is kept: nothing to save there).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "nn/graph_builder.hpp"

namespace ringtrain {
namespace {

struct Case {
  const char* model;
  Shape input;
  int64_t classes;
  std::vector<std::pair<std::string, std::string>> vars;
  DType compute;
  size_t segments;  // repeat-body runs the model has
  bool saves;       // bodies of several nodes: less memory (a one-node body keeps its output)
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data, b.data, a.bytes()) == 0;
}

std::vector<char> bytes_of(const Tensor& t) {
  const char* p = static_cast<const char*>(t.data);
  return std::vector<char>(p, p + t.bytes());
}

class Recompute : public ::testing::TestWithParam<Case> {};

TEST_P(Recompute, BitwiseTheSameWithLessActivationMemory) {
  const Case& c = GetParam();
  auto backend = kernels::make_cpu_backend(1);
  auto ref = build_model(c.model, c.input, c.classes, c.vars, c.compute);
  auto rec = build_model(c.model, c.input, c.classes, c.vars, c.compute);
  ASSERT_EQ(rec->recompute_segments(), c.segments) << c.model;
  rec->set_recompute(true);
  ref->init_parameters(7, *backend);
  rec->init_parameters(7, *backend);
  const bool tokens = std::string(c.model).rfind("gpt", 0) == 0;
  Shape xs = c.input;
  xs.insert(xs.begin(), 3);  // a batch of 3
  std::vector<float> xf(size_t(shape_numel(xs)));
  std::vector<int32_t> xi(xf.size());
  OwnedTensor dl;
  for (int step = 0; step < 3; ++step) {
    Rng rng(uint64_t(100 + step));
    for (size_t i = 0; i < xf.size(); ++i) {
      xf[i] = rng.uniform();
      xi[i] = int32_t(rng.below(uint64_t(c.classes)));
    }
    const Tensor x = tokens ? Tensor(xi.data(), xs, DType::i32) : Tensor(xf.data(), xs, DType::f32);
    Context ctx{*backend, c.compute, true, 1000 + uint64_t(step)};
    std::vector<std::vector<char>> logits, grads, state;
    for (Model* m : {ref.get(), rec.get()}) {
      m->reset_activation_peak();
      const Tensor& y = m->forward(ctx, x);
      logits.push_back(bytes_of(y));
      Tensor& d = dl.ensure(y.shape, DType::f32);
      for (int64_t i = 0; i < d.numel(); ++i) d.as<float>()[i] = 1e-3f * float((i + step) % 7);
      m->backward(ctx, d);
      grads.push_back(bytes_of(m->grad()));
      state.push_back(bytes_of(m->state()));
      // The shared parameter's gradient (GPT's head) is added into its owner's: compared too.
    }
    EXPECT_EQ(logits[0], logits[1]) << c.model << " step " << step << ": logits";
    EXPECT_EQ(grads[0], grads[1]) << c.model << " step " << step << ": gradients";
    EXPECT_EQ(state[0], state[1]) << c.model << " step " << step << ": running averages";
    const size_t peak_ref = ref->activation_peak(), peak_rec = rec->activation_peak();
    EXPECT_GT(peak_ref, 0u);
    if (c.saves) {
      EXPECT_LT(peak_rec, peak_ref) << c.model << " step " << step;
    }
    if (tokens && step > 0) {  // the goal: down by at least the number of blocks / 2
      EXPECT_GE(double(peak_ref) / double(peak_rec), double(c.segments) / 2)
          << c.model << ": activation bytes at the peak " << peak_ref << " without, " << peak_rec
          << " with recomputation";
    }
    // An evaluation forward between steps (no backward follows it) changes nothing.
    Context eval{*backend, c.compute, false, 0};
    EXPECT_EQ(bytes_of(ref->forward(eval, x)), bytes_of(rec->forward(eval, x))) << c.model;
  }
  EXPECT_TRUE(same_bytes(ref->work(), rec->work()));
}

INSTANTIATE_TEST_SUITE_P(
    Models, Recompute,
    ::testing::Values(Case{"gpt-tiny",
                           {16},
                           50,
                           {{"layers", "4"},
                            {"heads", "2"},
                            {"width", "32"},
                            {"context", "16"},
                            {"padded_vocab", "64"},
                            {"dropout", "0.2"}},
                           DType::f32,
                           4,
                           true},
                      Case{"gpt-tiny",
                           {16},
                           50,
                           {{"layers", "3"},
                            {"heads", "2"},
                            {"width", "32"},
                            {"context", "16"},
                            {"padded_vocab", "64"},
                            {"dropout", "0.1"}},
                           DType::bf16,
                           3,
                           true},
                      // 3 stages of 2 blocks: 6 bodies (the stage's body holds only the
                      // inner repeat, so no run of outer-body nodes).
                      Case{"resnet", {3, 8, 8}, 10, {{"depth", "2"}}, DType::f32, 6, true},
                      Case{"mlp", {1, 6, 6}, 10, {{"hidden", "24,16,12"}}, DType::f32, 3, false}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = std::string(info.param.model) + "_" + dtype_name(info.param.compute);
      for (char& ch : name)
        if (ch == '-') ch = '_';
      return name;
    });

// A model without a repeat body has no segments; recomputation changes nothing there.
TEST(Recompute, ModelWithoutRepeatBodyHasNoSegments) {
  auto m = build_model("cnn", {1, 12, 12}, 10, {}, DType::f32);
  EXPECT_EQ(m->recompute_segments(), 0u);
}

}  // namespace
}  // namespace ringtrain
