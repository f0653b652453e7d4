// Model::shard_masters (ZeRO-1 in fp16/bf16): a model that keeps a shard of the fp32 masters
// and the full fp32 copy of the parameters its layers read in fp32 computes bitwise what the
// whole model computes: the same working copy, the same logits and gradients, on MLP (a
// layer kept in fp32), CNN (BatchNorm, conv biases, a conv in fp32), ResNet and GPT (LayerNorm,
// tied embedding). A parameter a layer reads in fp32 without declaring it would be an empty
// view here, and the forward would fail or differ.
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
  const char* layer_precision;
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data, b.data, a.bytes()) == 0;
}

class ShardMasters : public ::testing::TestWithParam<Case> {};

TEST_P(ShardMasters, ShardedModelComputesBitwiseTheSame) {
  const Case& c = GetParam();
  auto backend = kernels::make_cpu_backend(1);
  auto whole = build_model(c.model, c.input, c.classes, c.vars, c.compute, c.layer_precision);
  whole->init_parameters(7, *backend);
  const int64_t n = whole->num_params();
  // A batch of 2: token ids for GPT, pixels otherwise.
  Shape xs = c.input;
  xs.insert(xs.begin(), 2);
  const bool tokens = c.input.size() == 1 && std::string(c.model).rfind("gpt", 0) == 0;
  std::vector<float> xf(size_t(shape_numel(xs)));
  std::vector<int32_t> xi(xf.size());
  Rng rng(3);
  for (size_t i = 0; i < xf.size(); ++i) {
    xf[i] = rng.uniform();
    xi[i] = int32_t(rng.below(uint64_t(c.classes)));
  }
  const Tensor x = tokens ? Tensor(xi.data(), xs, DType::i32) : Tensor(xf.data(), xs, DType::f32);
  Context ctx{*backend, c.compute, true, 11};
  OwnedTensor dl;
  auto run = [&](Model& m) {
    const Tensor& logits = m.forward(ctx, x);
    std::vector<float> out(static_cast<const float*>(logits.data),
                           static_cast<const float*>(logits.data) + logits.numel());
    Tensor& d = dl.ensure(logits.shape, DType::f32);
    for (int64_t i = 0; i < d.numel(); ++i) d.as<float>()[i] = 1e-3f * float(i % 7);
    m.backward(ctx, d);
    return out;
  };
  const auto ref_logits = run(*whole);
  for (auto [lo, hi] :
       {std::pair<int64_t, int64_t>{0, n / 3}, {n / 3, 2 * n / 3}, {2 * n / 3, n}}) {
    auto part = build_model(c.model, c.input, c.classes, c.vars, c.compute, c.layer_precision);
    part->shard_masters(lo, hi);
    part->init_parameters(7, *backend);
    ASSERT_TRUE(part->masters_sharded());
    ASSERT_EQ(part->master().numel(), hi - lo);
    EXPECT_TRUE(same_bytes(part->master(), whole->master().slice(lo, {hi - lo})))
        << c.model << ": the shard of the masters [" << lo << ", " << hi << ")";
    EXPECT_TRUE(same_bytes(part->work(), whole->work())) << c.model << ": the working copy";
    int64_t fp32_read = 0;
    for (size_t i = 0; i < part->params().size(); ++i) {
      const Param& p = part->params()[i];
      if (p.master.data == nullptr) continue;
      fp32_read += p.master.numel();
      EXPECT_TRUE(same_bytes(p.master, whole->params()[i].master)) << p.name;
    }
    EXPECT_EQ(fp32_read, part->fp32_copy().numel());
    EXPECT_GT(fp32_read, 0) << c.model;
    EXPECT_LT(fp32_read, n / 4) << c.model << ": the fp32 copy is a small part";
    EXPECT_EQ(part->fp32_count_in(0, n), fp32_read);
    EXPECT_EQ(run(*part), ref_logits) << c.model << ": logits";
    EXPECT_TRUE(same_bytes(part->grad(), whole->grad())) << c.model << ": gradients";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, ShardMasters,
    ::testing::Values(Case{"mlp", {1, 8, 8}, 10, {{"hidden", "24,16"}}, DType::bf16, "fc2=fp32"},
                      Case{"cnn", {1, 12, 12}, 10, {}, DType::bf16, "conv2=fp32"},
                      Case{"cnn", {1, 12, 12}, 10, {}, DType::f16, ""},
                      Case{"resnet", {3, 8, 8}, 10, {}, DType::bf16, ""},
                      Case{"gpt-tiny",
                           {8},
                           50,
                           {{"layers", "2"},
                            {"heads", "2"},
                            {"width", "16"},
                            {"context", "8"},
                            {"padded_vocab", "64"}},
                           DType::bf16,
                           ""}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = std::string(info.param.model) + "_" + dtype_name(info.param.compute) +
                         "_" + std::to_string(info.index);
      for (char& ch : name)
        if (ch == '-') ch = '_';
      return name;
    });

}  // namespace
}  // namespace ringtrain
