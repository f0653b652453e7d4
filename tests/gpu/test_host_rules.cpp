// The CUDA backend's decisions that need no device, tested on any machine (label unit):
//  - GEMM dtypes (gemm_types.hpp) for every GEMM the models make, recorded from real forward
//    and backward passes on the CPU backend: in a 16-bit model every GEMM runs on tensor
//    cores in that dtype (the last layer's backward included, where fp32 dlogits meet 16-bit
//    activations and weights); fp32 stays strict unless TF32 is allowed; a layer kept in
//    fp32 by --layer-precision keeps its three GEMMs in fp32.
//  - cuDNN algorithm selection (conv_select.hpp) on synthetic heuristic answers: a failed
//    query falls back to the deterministic list, strict fp32 runs FMA math with the
//    workspace asked again for it, nothing over the cap or unsupported is chosen, and the
//    "none fits" answer names the smallest workspace.
//  - the softmax kernel's arg-max rule (argmax_rule.hpp) reduced as a warp does, against the
//    CPU backend's answer, with NaNs, infinities, signed zeros and ties.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "core/error.hpp"
#include "kernels/cuda/argmax_rule.hpp"
#include "kernels/cuda/conv_select.hpp"
#include "kernels/cuda/gemm_types.hpp"
#include "kernels/forwarding_backend.hpp"
#include "kernels/kernels.hpp"
#include "nn/graph_builder.hpp"

namespace ringtrain::test {
namespace {

using kernels::cuda::choose_gemm_types;
using GemmDtypes = std::array<DType, 3>;  // a, b, c

// The CPU backend, recording the dtypes of every GEMM it is asked for.
class GemmRecorder final : public kernels::ForwardingBackend {
 public:
  explicit GemmRecorder(kernels::Backend& be) : ForwardingBackend(be) {}
  std::vector<GemmDtypes> gemms;

 protected:
  void do_gemm(bool ta, bool tb, float alpha, const Tensor& a, const Tensor& b, float beta,
               const Tensor& c) override {
    gemms.push_back({a.dtype, b.dtype, c.dtype});
    ForwardingBackend::do_gemm(ta, tb, alpha, a, b, beta, c);
  }
};

// A built-in model and the vars it is built with.
struct Spec {
  std::string name;
  Shape input;
  int64_t classes = 4;
  std::vector<std::pair<std::string, std::string>> vars;
  std::string layer_precision;  // --layer-precision
};

Spec spec_of(const std::string& name) {
  Spec spec;
  spec.name = name;
  if (name == "mlp") {
    spec.input = {1, 8, 8};
    spec.vars = {{"hidden", "16,8"}};
  } else if (name == "cnn") {
    spec.input = {1, 12, 12};
  } else {
    spec.input = {3, 8, 8};
    spec.vars = {{"depth", "1"}, {"width", "8"}};
  }
  return spec;
}

// The dtypes of every GEMM of one training step (forward, loss, backward) of `spec`.
std::vector<GemmDtypes> gemms_of_a_step(const Spec& spec, DType precision) {
  auto cpu = kernels::make_cpu_backend(1);
  GemmRecorder rec(*cpu);
  auto model =
      build_model(spec.name, spec.input, spec.classes, spec.vars, precision, spec.layer_precision);
  model->init_parameters(5, *cpu);
  const int64_t batch = 3;
  Shape xs{batch};
  for (int64_t d : spec.input) xs.push_back(d);
  OwnedTensor x32, xc, labels, dl;
  Tensor& x = x32.ensure(xs, DType::f32, Device{});
  for (int64_t i = 0; i < x.numel(); ++i) x.as<float>()[i] = float(i % 7) / 7.f - 0.5f;
  Tensor& y = labels.ensure({batch}, DType::i32, Device{});
  for (int64_t i = 0; i < batch; ++i) y.as<int32_t>()[i] = int32_t(i % spec.classes);
  const Tensor* in = &x;
  if (precision != DType::f32) {
    cpu->cast(x, xc.ensure(xs, precision, Device{}));
    in = &xc.view;
  }
  Context ctx{rec, precision, true, 1};
  const Tensor& logits = model->forward(ctx, *in);
  Tensor& dlt = dl.ensure(logits.shape, DType::f32, Device{});
  rec.softmax_xent(logits, y, 1.f, &dlt, 0.f);
  model->backward(ctx, dlt);
  return rec.gemms;
}

std::string text(const GemmDtypes& g) {
  return cat("a ", dtype_name(g[0]), " b ", dtype_name(g[1]), " c ", dtype_name(g[2]));
}

TEST(GemmTypes, SixteenBitModelsRunEveryGemmOnTensorCores) {
  for (const char* name : {"mlp", "cnn", "resnet"})
    for (DType p : {DType::f16, DType::bf16}) {
      SCOPED_TRACE(cat(name, " ", dtype_name(p)));
      const auto gemms = gemms_of_a_step(spec_of(name), p);
      ASSERT_FALSE(gemms.empty());
      bool last_layer_mix = false;  // fp32 dlogits against 16-bit x or W
      for (const auto& g : gemms) {
        last_layer_mix |= g[0] == DType::f32 && g[1] == p;
        for (bool tf32 : {false, true}) {
          const auto t = choose_gemm_types(g[0], g[1], g[2], tf32);
          EXPECT_TRUE(t.tensor_cores()) << text(g);
          EXPECT_EQ(t.in, p) << text(g);
          EXPECT_FALSE(t.tf32) << text(g);
          EXPECT_TRUE(t.out == g[2] || t.out == DType::f32) << text(g);
        }
      }
      // The mix that fell back to strict fp32 is among what the model makes.
      EXPECT_TRUE(last_layer_mix) << "no fp32-gradient GEMM recorded";
    }
}

TEST(GemmTypes, Fp32ModelsStayStrictUnlessTf32IsAllowed) {
  for (const char* name : {"mlp", "cnn", "resnet"}) {
    SCOPED_TRACE(name);
    const auto gemms = gemms_of_a_step(spec_of(name), DType::f32);
    ASSERT_FALSE(gemms.empty());
    for (const auto& g : gemms) {
      const auto strict = choose_gemm_types(g[0], g[1], g[2], false);
      EXPECT_EQ(strict.in, DType::f32) << text(g);
      EXPECT_FALSE(strict.tensor_cores()) << text(g);
      EXPECT_EQ(strict.out, DType::f32) << text(g);
      EXPECT_TRUE(choose_gemm_types(g[0], g[1], g[2], true).tf32) << text(g);
    }
  }
}

TEST(GemmTypes, ALayerKeptInFp32KeepsItsGemmsInFp32) {
  Spec spec = spec_of("mlp");  // fc1 16, fc2 8, fc3 4 classes
  spec.layer_precision = "fc2=fp32";
  for (DType p : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(p));
    const auto gemms = gemms_of_a_step(spec, p);
    int fp32 = 0, tensor = 0;
    for (const auto& g : gemms) {
      const auto t = choose_gemm_types(g[0], g[1], g[2], false);
      (t.tensor_cores() ? tensor : fp32)++;
    }
    // fc2: forward, dW, dx in fp32; fc1 (forward, dW: it needs no dx) and fc3 (three) on
    // tensor cores.
    EXPECT_EQ(fp32, 3);
    EXPECT_EQ(tensor, 5);
  }
}

TEST(GemmTypes, CDtypesCuBlasCannotWriteGoThroughFp32) {
  const DType all[] = {DType::f32, DType::f16, DType::bf16};
  for (DType a : all)
    for (DType b : all)
      for (DType c : all) {
        const auto t = choose_gemm_types(a, b, c, false);
        EXPECT_EQ(t.in, b);
        // cuBLASLt writes C in the input dtype or fp32; anything else is cast afterwards.
        EXPECT_EQ(t.out, c == b ? c : DType::f32)
            << dtype_name(a) << " " << dtype_name(b) << " " << dtype_name(c);
      }
}

// ---- convolution algorithm selection ----------------------------------------------------

using kernels::cuda::choose_conv_algo;
using kernels::cuda::ConvCandidate;
using kernels::cuda::ConvSelectRules;
constexpr int kFma = 10, kDefault = 11, kTensor = 12;  // stand-ins for cuDNN's math types
constexpr size_t kMiB = size_t(1) << 20;

ConvSelectRules rules(bool strict, size_t cap) {
  ConvSelectRules r;
  r.strict_fp32 = strict;
  r.fma_math = kFma;
  r.default_math = kDefault;
  r.fallback_math = strict ? kFma : kTensor;
  r.cap = cap;
  return r;
}

// cuDNN's workspace answers: size per (algo, math); absent: NOT_SUPPORTED. Records the asks.
struct FakeCudnn {
  std::map<std::pair<int, int>, size_t> sizes;
  std::vector<std::pair<int, int>> asked;
  kernels::cuda::ConvWorkspaceQuery query() {
    return [this](int algo, int math) -> std::optional<size_t> {
      asked.push_back({algo, math});
      auto it = sizes.find({algo, math});
      if (it == sizes.end()) return std::nullopt;
      return it->second;
    };
  }
};

TEST(ConvSelect, FailedHeuristicQueryFallsBackToTheDeterministicList) {
  FakeCudnn dnn;
  dnn.sizes = {{{7, kTensor}, 4 * kMiB}, {{1, kTensor}, 2 * kMiB}};
  const auto c = choose_conv_algo({}, {5, 1, 7}, rules(false, 64 * kMiB), dnn.query());
  ASSERT_TRUE(c.found);
  EXPECT_EQ(c.algo, 1);  // 5 unsupported, 1 is first that is
  EXPECT_EQ(c.math, kTensor);
  EXPECT_EQ(c.workspace, 2 * kMiB);
  EXPECT_TRUE(c.from_fallback);
}

TEST(ConvSelect, StrictFp32RunsFmaWithTheWorkspaceAskedForFma) {
  FakeCudnn dnn;
  // The heuristic measured algo 3 with default math at 1 MiB; with FMA forced it needs 3 MiB.
  dnn.sizes = {{{3, kFma}, 3 * kMiB}, {{3, kDefault}, 1 * kMiB}, {{4, kFma}, 0}};
  const std::vector<ConvCandidate> rows = {
      {2, true, true, kTensor, 0},          // tensor-op math: not for strict fp32
      {3, true, true, kDefault, 1 * kMiB},  // accepted, run as FMA
      {4, true, true, kFma, 0}};
  const auto c = choose_conv_algo(rows, {}, rules(true, 64 * kMiB), dnn.query());
  ASSERT_TRUE(c.found);
  EXPECT_EQ(c.algo, 3);
  EXPECT_EQ(c.math, kFma);
  EXPECT_EQ(c.workspace, 3 * kMiB) << "the workspace of the math type actually set";
  EXPECT_FALSE(c.from_fallback);
  for (const auto& [algo, math] : dnn.asked) EXPECT_EQ(math, kFma) << "asked algo " << algo;
}

TEST(ConvSelect, SkipsNonDeterministicFailedUnsupportedAndOverCapRows) {
  FakeCudnn dnn;
  dnn.sizes = {{{0, kTensor}, 0},           // row 0 is non-deterministic
               {{1, kTensor}, 0},           // row 1 failed in the heuristic
               {{3, kTensor}, 100 * kMiB},  // row 3 fits as measured, not as asked again
               {{6, kTensor}, 8 * kMiB}};   // row 4 (algo 5) is unsupported when asked
  const std::vector<ConvCandidate> rows = {{0, true, false, kTensor, 0},
                                           {1, false, true, kTensor, 0},
                                           {3, true, true, kTensor, 1 * kMiB},
                                           {5, true, true, kTensor, 0},
                                           {6, true, true, kTensor, 8 * kMiB}};
  const auto c = choose_conv_algo(rows, {}, rules(false, 64 * kMiB), dnn.query());
  ASSERT_TRUE(c.found);
  EXPECT_EQ(c.algo, 6);
  EXPECT_EQ(c.workspace, 8 * kMiB);
}

TEST(ConvSelect, StrictFp32WithoutAFittingRowTriesTheFallbackListWithFma) {
  FakeCudnn dnn;
  dnn.sizes = {{{1, kFma}, 900 * kMiB}, {{2, kFma}, 700 * kMiB}, {{9, kFma}, 16 * kMiB}};
  const std::vector<ConvCandidate> rows = {{1, true, true, kFma, 900 * kMiB}};
  const auto c = choose_conv_algo(rows, {2, 9}, rules(true, 512 * kMiB), dnn.query());
  ASSERT_TRUE(c.found);
  EXPECT_EQ(c.algo, 9);
  EXPECT_EQ(c.math, kFma);
  EXPECT_TRUE(c.from_fallback);
}

TEST(ConvSelect, NothingFitsNamesTheSmallestWorkspace) {
  FakeCudnn dnn;
  dnn.sizes = {{{1, kFma}, 900 * kMiB}, {{2, kFma}, 700 * kMiB}};
  const std::vector<ConvCandidate> rows = {{1, true, true, kFma, 900 * kMiB}};
  const auto c = choose_conv_algo(rows, {2, 3}, rules(true, 512 * kMiB), dnn.query());
  EXPECT_FALSE(c.found);
  EXPECT_EQ(c.smallest_over_cap, 700 * kMiB);
  FakeCudnn none;  // nothing supported at all
  const auto d = choose_conv_algo({}, {1, 2}, rules(false, 512 * kMiB), none.query());
  EXPECT_FALSE(d.found);
  EXPECT_EQ(d.smallest_over_cap, 0u);
}

// ---- arg-max of softmax cross-entropy ---------------------------------------------------

using kernels::cuda::ArgMax;

// The kernel's reduction of one row, simulated: 32 lanes fold their strided elements, then
// the xor butterfly of __shfl_xor_sync (each round reads the previous round's values).
// Returns lane 0's answer; every lane must agree.
int64_t warp_argmax(const std::vector<float>& x) {
  const int64_t c = int64_t(x.size());
  std::array<ArgMax, 32> lane{};
  for (int l = 0; l < 32; ++l)
    for (int64_t j = l; j < c; j += 32)
      kernels::cuda::argmax_visit(lane[size_t(l)], x[size_t(j)], j);
  for (int off = 16; off > 0; off >>= 1) {
    const auto prev = lane;
    for (int l = 0; l < 32; ++l)
      lane[size_t(l)] = kernels::cuda::argmax_merge(prev[size_t(l)], prev[size_t(l ^ off)]);
  }
  const int64_t arg = kernels::cuda::argmax_result(lane[0], x[0]);
  for (int l = 1; l < 32; ++l)
    EXPECT_EQ(kernels::cuda::argmax_result(lane[size_t(l)], x[0]), arg) << "lane " << l;
  return arg;
}

// The CPU backend's arg-max of one row: the label for which it counts the row correct.
int64_t cpu_argmax(kernels::Backend& cpu, const std::vector<float>& x) {
  const int64_t c = int64_t(x.size());
  std::vector<float> row = x;
  Tensor logits(row.data(), {1, c}, DType::f32);
  int64_t found = -1;
  for (int32_t label = 0; label < c; ++label) {
    int32_t l = label;
    Tensor lab(&l, {1}, DType::i32);
    if (cpu.softmax_xent(logits, lab, 1.f, nullptr).correct == 1) {
      EXPECT_EQ(found, -1) << "two labels counted correct";
      found = label;
    }
  }
  return found;
}

TEST(ArgMaxRule, WarpReductionMatchesTheCpuWithNanInfAndTies) {
  auto cpu = kernels::make_cpu_backend(1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<std::vector<float>> rows = {
      {nan, 1, 2},                    // NaN first: the CPU keeps index 0
      {1, nan, 3},  {-0.f, 0.f, -1},  // equal zeros: the first
      {-inf, -inf}, {nan, nan, nan}, {2, inf, nan, inf},
  };
  // A NaN in lane 12 shadowing the row's maximum in lane 28 (the butterfly pairs them
  // first): the reduction must not lose the maximum behind it.
  std::vector<float> shadow(32, 0.f);
  shadow[12] = nan;
  shadow[28] = 9.f;
  rows.push_back(shadow);
  std::mt19937 gen(17);
  std::uniform_real_distribution<float> u(-3, 3);
  for (int64_t c : {1, 2, 5, 31, 32, 33, 64, 100, 1000})
    for (int rep = 0; rep < 12; ++rep) {
      std::vector<float> x(static_cast<size_t>(c));
      for (auto& v : x) v = std::round(u(gen) * 2.f) / 2.f;  // coarse values: many ties
      const int specials = rep % 4;
      for (int s = 0; s < specials * (1 + int(c) / 16); ++s) {
        const size_t at = gen() % size_t(c);
        x[at] = (gen() % 3 == 0) ? (gen() % 2 ? inf : -inf) : nan;
      }
      if (rep == 5) x[0] = nan;
      rows.push_back(x);
    }
  for (size_t i = 0; i < rows.size(); ++i)
    EXPECT_EQ(warp_argmax(rows[i]), cpu_argmax(*cpu, rows[i]))
        << "row " << i << " of width " << rows[i].size();
}

}  // namespace
}  // namespace ringtrain::test
