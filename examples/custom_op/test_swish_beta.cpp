// The swish_beta op's unit test: finite differences through ringtrain's graph executor for
// every parameter of a small model using the op both ways (per channel after a conv, one
// beta after a linear), so both the op's beta gradient and its input gradient (which the
// conv and linear weights' gradients go through) are checked; and the attribute checks of
// the model file (unknown attribute, wrong kind, bad value) with their FILE:LINE:COLUMN.
// Links swish_beta.cpp and the installed ringtrain::nn; exit status 0 when every check holds.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "nn/graph_builder.hpp"
#include "nn/model_file.hpp"

namespace {

using namespace ringtrain;

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// The init gives the betas values away from 1 (plain swish) and from each other.
const char* kModel = R"pb(
  node {
    name: "conv"
    conv { out_channels: 3 kernel: 3 padding: 1 }
  }
  node {
    name: "act1"
    custom { type: "swish_beta" }
    init { param: "beta" kind: NORMAL std: 0.8 }
  }
  node {
    name: "flat"
    flatten {}
  }
  node {
    name: "fc"
    linear { out_features: 6 }
  }
  node {
    name: "act2"
    custom {
      type: "swish_beta"
      attr { name: "per_channel" int_value: 0 }
    }
    init { param: "beta" kind: NORMAL std: 0.8 }
  }
  node {
    name: "out"
    linear {}
    set { field: "out_features" expr: "classes" }
  }
)pb";

void finite_differences() {
  auto be = kernels::make_cpu_backend(1);
  ModelFile f = ModelFile::parse(kModel, "model.pbtxt");
  f.set_data_shape({2, 4, 4}, 3, "test");
  auto m = build_model(f, DType::f32);
  m->init_parameters(11, *be);
  // conv.weight, conv.bias, act1.beta, fc.weight, fc.bias, act2.beta, out.weight, out.bias
  check(m->params().size() == 8, "the model has 8 parameters");
  check(m->params()[2].name == "act1.beta" && m->params()[2].shape == Shape{3},
        "act1.beta is one beta per channel");
  check(m->params()[5].name == "act2.beta" && m->params()[5].shape == Shape{1},
        "act2.beta (per_channel: 0) is one beta");
  Context ctx{*be, DType::f32, true, 0};
  const int64_t n = 3;
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> xv(size_t(n * 2 * 4 * 4)), r(size_t(n * 3));
  for (float& v : xv) v = u(gen);
  for (float& v : r) v = u(gen);
  const Tensor x(xv.data(), {n, 2, 4, 4}, DType::f32);
  // objective = sum(logits * r), so d objective / d logits = r.
  auto objective = [&] {
    const Tensor& y = m->forward(ctx, x);
    double s = 0;
    for (int64_t i = 0; i < y.numel(); ++i) s += double(y.as<float>()[i]) * r[size_t(i)];
    return s;
  };
  objective();
  m->backward(ctx, Tensor(r.data(), {n, 3}, DType::f32));
  const float* g = m->grad().as<float>();
  const std::vector<float> grad(g, g + m->num_params());
  float* w = m->master().as<float>();
  double worst = 0;
  int bad = 0;
  for (int64_t i = 0; i < m->num_params(); ++i) {
    const float keep = w[i], eps = 1e-2f;
    w[i] = keep + eps;
    const double up = objective();
    w[i] = keep - eps;
    const double down = objective();
    w[i] = keep;
    const double numeric = (up - down) / (2 * double(eps));
    const double err = std::fabs(numeric - grad[size_t(i)]) / std::max(1.0, std::fabs(numeric));
    worst = std::max(worst, err);
    if (err > 2e-3) {
      ++bad;
      std::printf("  parameter element %lld: numeric %.6f analytic %.6f\n",
                  static_cast<long long>(i), numeric, grad[size_t(i)]);
    }
  }
  std::printf("  %lld parameter elements, worst relative error %.2e\n",
              static_cast<long long>(m->num_params()), worst);
  check(bad == 0, "finite differences agree with backward (relative error <= 2e-3)");
  const int64_t b1 = m->params()[2].offset, b2 = m->params()[5].offset;
  check(grad[size_t(b1)] != 0.f && grad[size_t(b2)] != 0.f, "the betas' gradients are not zero");
}

// plan_model(text) must fail with an input error whose message starts with `where`.
void bad_file(const std::string& name, const std::string& node_text, const std::string& where,
              const std::string& says) {
  const std::string text = "node { name: \"flat\" flatten {} }\nnode {\n  name: \"act\"\n" +
                           node_text + "\n}\nnode { name: \"out\" linear { out_features: 3 } }\n";
  std::string msg;
  try {
    ModelFile f = ModelFile::parse(text, name);
    f.set_data_shape({4}, 3, "test");
    plan_model(f);
  } catch (const Error& e) {
    msg = e.kind() == ErrorKind::input ? e.what() : "";
  }
  check(msg.rfind(where, 0) == 0 && msg.find(says) != std::string::npos, name + ": '" + msg + "'");
}

}  // namespace

int main() {
  finite_differences();
  bad_file("unknown.pbtxt",
           "  custom { type: \"swish_beta\"\n    attr { name: \"per_chanel\" int_value: 0 } }",
           "unknown.pbtxt:5:5: node 'act': ", "has no attribute 'per_chanel'");
  bad_file("kind.pbtxt",
           "  custom { type: \"swish_beta\"\n    attr { name: \"per_channel\" float_value: 0.5 } }",
           "kind.pbtxt:5:5: node 'act': ", "needs an integer");
  bad_file("value.pbtxt",
           "  custom { type: \"swish_beta\"\n    attr { name: \"per_channel\" int_value: 2 } }",
           "value.pbtxt:2:1: node 'act': ", "per_channel is 2; expected 0 or 1");
  std::printf("%s\n", failures ? "FAILED" : "all checks passed");
  return failures ? 1 : 0;
}
