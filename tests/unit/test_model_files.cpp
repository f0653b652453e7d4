// Model files and the graph executor: the shipped files build the networks of the
// pre-file code (initial values hashed by that code), finite-difference gradients through a
// graph with fan-out, add, concat and a shared parameter, expressions, and errors that name
// FILE:LINE:COLUMN and the node.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.hpp"
#include "layer_test_util.hpp"
#include "nn/expr.hpp"
#include "nn/graph_builder.hpp"
#include "nn/legacy_model_json.hpp"
#include "nn/model_file.hpp"
#include "test_util.hpp"

namespace ringtrain {
namespace {

uint64_t fnv(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
  auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

// The hashes were printed by the pre-file build_model (commit a2ca303) for the same models,
// seed 7: masters then state buffers, FNV-1a over the fp32 bytes.
TEST(ShippedModels, InitialValuesEqualThePreviousBuiltins) {
  auto be = kernels::make_cpu_backend(1);
  struct Case {
    std::string name;
    Shape input;
    int64_t classes;
    std::vector<std::pair<std::string, std::string>> vars;
    int64_t params;
    uint64_t hash;
  };
  const std::vector<Case> cases{
      {"mlp", {1, 28, 28}, 10, {{"hidden", "64,32"}}, 52650, 0x5b85de06cf248397ull},
      {"cnn", {1, 28, 28}, 10, {}, 1199882, 0xa1a4bb073edadfb1ull},
      {"resnet",
       {3, 16, 16},
       7,
       {{"depth", "2"}, {"width", "4"}, {"activation", "gelu"}},
       11323,
       0xab059f4c730b8b50ull},
  };
  for (const auto& c : cases) {
    auto m = build_model(c.name, c.input, c.classes, c.vars, DType::f32);
    m->init_parameters(7, *be);
    EXPECT_EQ(m->num_params(), c.params) << c.name;
    uint64_t h = fnv(m->master().data, size_t(m->num_params()) * 4);
    h = fnv(m->state().data, size_t(m->num_buffer_elems()) * 4, h);
    EXPECT_EQ(h, c.hash) << c.name << ": initial values differ from the previous built-in";
  }
}

// A graph with every kind of edge: the input read by two nodes, add, concat, an output read
// by two nodes, and a parameter shared with an earlier node (summed gradients).
const char* kGraph = R"pb(
  node {
    name: "a"
    linear { out_features: 5 }
  }
  node {
    name: "a_act"
    activation { kind: GELU }
  }
  node {
    name: "b"
    input: "input"
    linear { out_features: 5 }
  }
  node {
    name: "sum"
    add {}
    input: "a_act"
    input: "b"
  }
  node {
    name: "c"
    linear { out_features: 5 }
    share { param: "weight" from: "a.weight" }
  }
  node {
    name: "c_act"
    activation { kind: GELU }
  }
  node {
    name: "cat"
    concat {}
    input: "c_act"
    input: "b"
  }
  node {
    name: "out"
    linear {}
    set { field: "out_features" expr: "classes" }
  }
)pb";

TEST(GraphExecutor, FiniteDifferencesThroughAddConcatAndSharing) {
  auto be = kernels::make_cpu_backend(1);
  ModelFile f = ModelFile::parse(kGraph, "graph.pbtxt");
  f.set_data_shape({5}, 3, "test");
  auto m = build_model(f, DType::f32);
  m->init_parameters(3, *be);
  // a.weight, a.bias, b.weight, b.bias, c.bias (c.weight is a.weight), out.weight, out.bias
  ASSERT_EQ(m->params().size(), 7u);
  EXPECT_EQ(m->num_params(), 25 + 5 + 25 + 5 + 5 + 30 + 3);
  Context ctx{*be, DType::f32, true, 0};
  const int64_t n = 4;
  auto xv = test::uniform_floats(size_t(n * 5), -1.f, 1.f, 5);
  auto r = test::uniform_floats(size_t(n * 3), -1.f, 1.f, 6);
  const Tensor x(xv.data(), {n, 5}, DType::f32);
  auto objective = [&] { return test::dot(m->forward(ctx, x), r); };
  objective();
  m->backward(ctx, Tensor(r.data(), {n, 3}, DType::f32));
  const std::vector<float> grad = test::copy_of(m->grad());
  float* w = m->master().as<float>();
  double worst = 0;
  for (int64_t i = 0; i < m->num_params(); ++i) {
    const float keep = w[i];
    const float eps = 1e-2f;
    w[i] = keep + eps;
    const double up = objective();
    w[i] = keep - eps;
    const double down = objective();
    w[i] = keep;
    const double numeric = (up - down) / (2 * double(eps));
    const double err = std::fabs(numeric - grad[size_t(i)]) / std::max(1.0, std::fabs(numeric));
    worst = std::max(worst, err);
    EXPECT_LT(err, 2e-3) << "parameter element " << i << ": numeric " << numeric << " analytic "
                         << grad[size_t(i)];
  }
  EXPECT_GT(worst, 0.0);  // the comparison ran on real values
  // The shared weight's gradient is the sum of both uses: not what `a` alone gives.
  const float a_only = grad[0];
  EXPECT_NE(a_only, 0.f);
}

TEST(Expressions, ArithmeticConditionsAndTemplates) {
  ExprScope s{{"width", ExprValue::of(int64_t(16))},
              {"hidden", ExprValue::of(std::vector<int64_t>{512, 256})},
              {"act", ExprValue::of(std::string("gelu"))}};
  EXPECT_EQ(eval_expr("width * pow(2, 3 - 1)", s).i, 64);
  EXPECT_EQ(eval_expr("len(hidden) + 1", s).i, 3);
  EXPECT_EQ(eval_expr("width > 8 && act == 'gelu' ? 2 : 1", s).i, 2);
  EXPECT_EQ(eval_expr("!(width <= 16)", s).i, 0);
  EXPECT_EQ(eval_expr("7 / 2", s).i, 3);
  EXPECT_DOUBLE_EQ(eval_expr("7.0 / 2", s).d, 3.5);
  EXPECT_EQ(expand_template("stage{1 + 1}.block{width / 8}.", s), "stage2.block2.");
  EXPECT_TRUE(test::throws_kind([&] { eval_expr("depth + 1", s); }, ErrorKind::input));
  EXPECT_TRUE(test::throws_kind([&] { eval_expr("width +", s); }, ErrorKind::input));
  EXPECT_TRUE(test::throws_kind([&] { eval_expr("width / 0", s); }, ErrorKind::input));
}

TEST(ModelFiles, ErrorsNameTheLineAndTheNode) {
  auto plan = [](const std::string& text) {
    ModelFile f = ModelFile::parse(text, "m.pbtxt");
    f.set_data_shape({1, 8, 8}, 4, "the data");
    plan_model(f);
  };
  std::string e = test::input_error([&] {
    plan(
        "node { name: \"c\" conv { out_channels: 4 kernel: 3 } }\n"
        "node { name: \"f\" flatten {} }\n"
        "node { name: \"x\" add {} input: \"c\" input: \"f\" }\n");
  });
  EXPECT_NE(e.find("m.pbtxt:3:1: node 'x': add"), std::string::npos) << e;
  EXPECT_NE(e.find("[4, 6, 6]"), std::string::npos) << e;
  EXPECT_NE(e.find("[144]"), std::string::npos) << e;
  e = test::input_error(
      [&] { plan("node { name: \"a\" linear { out_features: 4 } input: \"zz\" }\n"); });
  EXPECT_NE(e.find("m.pbtxt:1:45: node 'a': input 'zz'"), std::string::npos) << e;
}

TEST(ModelFiles, NormalisedTextRebuildsTheSameNetwork) {
  ModelFile f = ModelFile::load("resnet");
  f.override_var("depth", "2", "--depth");
  f.set_data_shape({3, 16, 16}, 10, "the data");
  f.add_layer_precision("stage2=fp32");
  ModelFile g = ModelFile::parse(f.normalised(), "checkpoint");
  EXPECT_EQ(first_difference(plan_model(f), plan_model(g)), "");
  EXPECT_EQ(g.normalised(), f.normalised());
  ModelFile h = ModelFile::load("resnet");
  h.set_data_shape({3, 16, 16}, 10, "the data");
  const std::string diff = first_difference(plan_model(h), plan_model(f));
  EXPECT_NE(diff.find("stage1.block2.conv1"), std::string::npos) << diff;
}

TEST(ModelFiles, OldCheckpointJsonMapsToTheShippedFile) {
  ModelFile f = model_file_from_legacy_json(
      R"({"name":"resnet","input":[3,16,16],"classes":10,"depth":2,"width":8,"activation":"gelu"})",
      "old.h5");
  ModelFile g = ModelFile::load("resnet");
  g.override_var("depth", "2", "--depth");
  g.override_var("width", "8", "--width");
  g.override_var("activation", "gelu", "--activation");
  g.set_data_shape({3, 16, 16}, 10, "the data");
  EXPECT_EQ(first_difference(plan_model(f), plan_model(g)), "");
  const std::string e = test::input_error([] {
    model_file_from_legacy_json(R"({"name":"vgg","input":[3,8,8],"classes":10})", "o.h5");
  });
  EXPECT_NE(e.find("'vgg'"), std::string::npos) << e;
}

TEST(ModelFiles, OverridesAreCheckedAgainstTheFile) {
  ModelFile f = ModelFile::load("cnn");
  std::string e = test::input_error([&] { f.override_var("hidden", "64", "--hidden"); });
  EXPECT_NE(e.find("--hidden: model 'cnn'"), std::string::npos) << e;
  EXPECT_NE(e.find("its parameters are dropout"), std::string::npos) << e;
  e = test::input_error([&] { f.override_var("dropout", "1.5", "--dropout"); });
  EXPECT_NE(e.find("--dropout 1.5 is not valid"), std::string::npos) << e;
  ModelFile r = ModelFile::load("resnet");
  e = test::input_error([&] { r.override_var("activation", "swish", "--activation"); });
  EXPECT_NE(e.find("expected one of relu, gelu"), std::string::npos) << e;
}

}  // namespace
}  // namespace ringtrain
