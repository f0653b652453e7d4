// The swish_beta op of the custom_op example: y = x * sigmoid(beta * x) with a learnable
// beta per channel (per_channel: 1, the default) or one beta for the whole sample
// (per_channel: 0) -- the Layer (parameters, forward, backward) and its registration.
// Built into libcustom_op.so, which `ringtrain train --plugin` loads, and into the op's unit
// test. Compiled against the installed headers only (find_package(ringtrain)).
#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "nn/layers.hpp"
#include "nn/op_registry.hpp"

// A namespace of the plugin's own: plugins are loaded RTLD_GLOBAL, so two libraries with a
// class of one name would share (and clash on) its symbols.
namespace custom_op {

using ringtrain::Context;
using ringtrain::DType;
using ringtrain::Init;
using ringtrain::OwnedTensor;
using ringtrain::Param;
using ringtrain::ParamSpec;
using ringtrain::Shape;
using ringtrain::Tensor;

class SwishBeta final : public ringtrain::Layer {
 public:
  // `sample`: one sample's shape ([C, H, W] or [D]); channels = its first dimension.
  SwishBeta(std::string name, const Shape& sample, bool per_channel)
      : Layer(std::move(name)),
        betas_(per_channel ? sample.at(0) : 1),
        inner_(ringtrain::shape_numel(sample) / sample.at(0)) {}

  // beta starts at 1 (plain swish/SiLU); weight decay off, as for other scale parameters.
  std::vector<ParamSpec> param_specs() const override {
    return {{"beta", {betas_}, 1, Init::ones, 1, 0, false}};
  }
  void bind(std::vector<Param*> params) override {
    RT_CHECK(params.size() == 1, "swish_beta binds 1 param, got ", params.size());
    beta_ = params[0];
  }

  // The arithmetic runs in fp32 on the host whatever the run's --precision: the input is
  // converted on the way in, the output on the way out.
  const Tensor& forward(Context& ctx, const Tensor& x) override {
    RT_REQUIRE(x.device.kind == ringtrain::Device::cpu, "swish_beta (layer ", name(),
               ") runs on --device cpu only");
    const Tensor& x32 = as_f32(ctx, x, x32_);
    x_ = x32;
    Tensor& y32 = y32_.ensure(x.shape, DType::f32);
    const float* xp = x32.as<float>();
    const float* b = beta_->master.as<float>();  // fp32 masters, as Linear's bias
    float* yp = y32.as<float>();
    const int64_t rows = x.numel() / inner_;  // (sample, channel) pairs
    for (int64_t r = 0; r < rows; ++r) {
      const float beta = b[betas_ == 1 ? 0 : r % betas_];
      for (int64_t i = r * inner_; i < (r + 1) * inner_; ++i) yp[i] = xp[i] * sigmoid(beta * xp[i]);
    }
    const DType out = out_dtype(ctx);
    if (out == DType::f32) return y32;
    Tensor& y = y_.ensure(x.shape, out);
    ctx.backend.cast(y32, y);
    return y;
  }

  // dy/dx = s + beta x s (1 - s) and dy/dbeta = x^2 s (1 - s), s = sigmoid(beta x).
  const Tensor& backward(Context& ctx, const Tensor& dy) override {
    const Tensor& dy32 = as_f32(ctx, dy, dy32_);
    const float* xp = x_.as<float>();
    const float* g = dy32.as<float>();
    const float* b = beta_->master.as<float>();
    Tensor& dx32 = dx32_.ensure(dy.shape, DType::f32);
    float* dxp = dx32.as<float>();
    std::vector<double> dbeta(size_t(betas_), 0.0);
    const int64_t rows = dy.numel() / inner_;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t c = betas_ == 1 ? 0 : r % betas_;
      const float beta = b[c];
      double acc = 0;
      for (int64_t i = r * inner_; i < (r + 1) * inner_; ++i) {
        const float s = sigmoid(beta * xp[i]);
        const float ds = s * (1.f - s);
        dxp[i] = g[i] * (s + beta * xp[i] * ds);
        acc += double(g[i]) * xp[i] * xp[i] * ds;
      }
      dbeta[size_t(c)] += acc;
    }
    // The parameter's gradient, in the flat gradient buffer's dtype.
    Tensor& db32 = db32_.ensure({betas_}, DType::f32);
    for (int64_t c = 0; c < betas_; ++c) db32.as<float>()[c] = float(dbeta[size_t(c)]);
    ctx.backend.cast(db32, beta_->grad);
    const DType d = dtype(ctx);
    if (!needs_input_grad_ || d == DType::f32) return dx32;
    Tensor& dx = dx_.ensure(dy.shape, d);
    ctx.backend.cast(dx32, dx);
    return dx;
  }

 private:
  static float sigmoid(float v) { return 1.f / (1.f + std::exp(-v)); }
  static const Tensor& as_f32(Context& ctx, const Tensor& t, OwnedTensor& scratch) {
    if (t.dtype == DType::f32) return t;
    Tensor& c = scratch.ensure(t.shape, DType::f32);
    ctx.backend.cast(t, c);
    return c;
  }

  int64_t betas_, inner_;
  Param* beta_ = nullptr;
  Tensor x_;  // the fp32 input of the last forward
  OwnedTensor x32_, y32_, y_, dy32_, dx32_, dx_, db32_;
};

namespace {

// `custom { type: "swish_beta" attr { name: "per_channel" int_value: 0 } }` in a model file.
RINGTRAIN_REGISTER_OP(
    swish_beta,
    ringtrain::OpDef{
        .name = "swish_beta",
        .infer = [](const ringtrain::OpNode& n) -> Shape {
          const int64_t pc = ringtrain::attr_int(n, "per_channel", 1);
          RT_REQUIRE(pc == 0 || pc == 1, "attribute per_channel is ", pc, "; expected 0 or 1");
          RT_REQUIRE(!n.inputs[0].empty(), "swish_beta needs an input of [C, H, W] or [D]");
          return n.inputs[0];
        },
        .build = [](const ringtrain::OpNode& n) -> std::unique_ptr<ringtrain::Layer> {
          return std::make_unique<SwishBeta>(n.name, n.inputs[0],
                                             ringtrain::attr_int(n, "per_channel", 1) != 0);
        },
        // sigmoid (~4), two multiplies
        .flops = [](const ringtrain::OpNode&,
                    const Shape& out) { return 6.0 * double(ringtrain::shape_numel(out)); }},
    {{"per_channel", ringtrain::AttrKind::integer}});

}  // namespace

}  // namespace custom_op
