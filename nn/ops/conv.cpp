// The convolution op: Conv2D (y = act(conv(x, W) + b)) and the registration of `conv`.
#include "core/error.hpp"
#include "nn/layers.hpp"
#include "nn/onnx_writer.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {

using kernels::Activation;

// ---- Conv2D ----------------------------------------------------------------------------

std::vector<ParamSpec> Conv2D::param_specs() const {
  const int64_t fan_in = o_.in_channels * o_.kernel * o_.kernel;
  std::vector<ParamSpec> specs{{"weight",
                                {o_.out_channels, o_.in_channels, o_.kernel, o_.kernel},
                                fan_in,
                                Init::fan_in_uniform,
                                o_.out_channels * o_.kernel * o_.kernel}};
  if (o_.bias)
    specs.push_back({"bias", {o_.out_channels}, fan_in, Init::fan_in_uniform, 1, 0, false, true});
  return specs;
}

// Fusion with the reader (Layer::fuse_with_reader): a Conv2D or MaxPool2D reader takes over
// the ReLU's gradient mask and reads the output in the backend's blocked layout.
void Conv2D::fuse_with_reader(Layer& reader) {
  if (activation() == kernels::Activation::relu && reader.take_relu_input())
    set_relu_grad_done_by_next(true);
  if (out_channels() % kernels::kChannelBlock == 0 && reader.take_blocked_input())
    set_output_blocked(true);
}

void Conv2D::bind(std::vector<Param*> params) {
  RT_CHECK(params.size() == (o_.bias ? 2u : 1u), "Conv2D binds ", o_.bias ? 2 : 1, " params, got ",
           params.size());
  weight_ = params[0];
  bias_ = o_.bias ? params[1] : nullptr;
}

const Tensor& Conv2D::forward(Context& ctx, const Tensor& x) {
  RT_REQUIRE(x.shape.size() == 4 && x.dim(1) == o_.in_channels, "layer ", name(),
             " expects input [N, ", o_.in_channels, ", H, W], got ", shape_str(x.shape));
  cs_ = {x.dim(0),  x.dim(1),  x.dim(2),  x.dim(3),  o_.out_channels,
         o_.kernel, o_.kernel, o_.stride, o_.padding};
  const kernels::Layout kept = ctx.backend.activation_layout(ctx.compute);
  cs_.x_layout = x_blocked_ ? kept : kernels::Layout::plain;
  cs_.y_layout = y_blocked_ ? kept : kernels::Layout::plain;
  RT_REQUIRE(cs_.p() > 0 && cs_.q() > 0, "layer ", name(), ": input ", x.dim(2), "x", x.dim(3),
             " is too small for a ", o_.kernel, "x", o_.kernel, " kernel with padding ",
             o_.padding);
  x_ = in_dtype(ctx, x, xin_);
  Tensor& y = y_.ensure({cs_.n, cs_.k, cs_.p(), cs_.q()}, out_dtype(ctx));
  ctx.backend.conv2d_forward(cs_, x_, weights(ctx, *weight_, weight_cast_),
                             bias_ ? &bias_->master : nullptr, o_.act, y);
  return y;
}

const Tensor& Conv2D::backward(Context& ctx, const Tensor& dy_in) {
  const Tensor dy =
      relu_grad_by_next_ ? dy_in : relu_masked(ctx, o_.act, y_.view, dy_in, dy_masked_);
  const Tensor dw = grad_target(ctx, *weight_, dw_);
  Tensor* dx = needs_input_grad_ ? &dx_.ensure(x_.shape, dtype(ctx)) : nullptr;
  const Tensor w = dx ? weights(ctx, *weight_, weight_cast_) : Tensor();
  ctx.backend.conv2d_backward(cs_, x_, dy, w, dx, dw, bias_ ? &bias_->grad : nullptr);
  if (dx && relu_input_) ctx.backend.relu_backward(x_, *dx, *dx);
  commit_grad(ctx, *weight_, dw);
  return dx_.view;
}

// ---- registration ----------------------------------------------------------------------

Activation fused_activation(pb::Activation a);  // nn/ops/linear.cpp

namespace {

Conv2D::Options conv_options(const OpNode& n) {
  const auto& o = n.def.conv();
  return {n.inputs[0].at(0),
          o.out_channels(),
          o.kernel(),
          o.has_stride() ? o.stride() : 1,
          o.padding(),
          !o.has_bias() || o.bias(),
          fused_activation(o.activation())};
}

RINGTRAIN_REGISTER_OP(
    conv, OpDef{.name = "conv",
                .infer = [](const OpNode& n) -> Shape {
                  const Shape& x = n.inputs[0];
                  RT_REQUIRE(x.size() == 3, "conv expects input [C, H, W], got ", shape_str(x));
                  const auto& o = n.def.conv();
                  RT_REQUIRE(o.out_channels() >= 1, "out_channels ", o.out_channels(),
                             " is not valid; expected a positive number");
                  RT_REQUIRE(o.kernel() >= 1, "kernel ", o.kernel(),
                             " is not valid; expected a positive number");
                  RT_REQUIRE(!o.has_stride() || o.stride() >= 1, "stride ", o.stride(),
                             " is not valid; expected a positive number");
                  RT_REQUIRE(o.padding() >= 0, "padding ", o.padding(), " is negative");
                  const Conv2D::Options c = conv_options(n);
                  const kernels::ConvShape cs{
                      1, x[0], x[1], x[2], c.out_channels, c.kernel, c.kernel, c.stride, c.padding};
                  RT_REQUIRE(cs.p() > 0 && cs.q() > 0, "input ", shape_str(x),
                             " is too small for a ", c.kernel, "x", c.kernel,
                             " kernel with padding ", c.padding);
                  return {c.out_channels, cs.p(), cs.q()};
                },
                .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
                  return std::make_unique<Conv2D>(n.name, conv_options(n));
                },
                .flops =
                    [](const OpNode& n, const Shape& out) {
                      const auto& o = n.def.conv();
                      return 2.0 * double(n.inputs[0][0] * o.kernel() * o.kernel()) *
                                 double(shape_numel(out)) +
                             double(shape_numel(out));
                    },
                .onnx =
                    [](const OpNode& n, OnnxWriter& w) {
                      const pb::Conv& o = n.def.conv();
                      const std::string name = w.output();
                      std::vector<std::string> ins = {w.input(0), w.param("weight")};
                      if (w.has_param("bias")) ins.push_back(w.param("bias"));
                      const bool act = o.activation() != pb::NONE;
                      const std::string y = act ? name + "/conv" : name;
                      const int64_t s = o.has_stride() ? o.stride() : 1, p = o.padding();
                      w.node("Conv", y, ins, {y},
                             {{"kernel_shape", std::vector<int64_t>{o.kernel(), o.kernel()}},
                              {"strides", std::vector<int64_t>{s, s}},
                              {"pads", std::vector<int64_t>{p, p, p, p}}});
                      return write_onnx_activation(w, o.activation(), y, name);
                    }});

}  // namespace

}  // namespace ringtrain
