// The activation op: ReLU and GELU layers (GeluTanh: nn/ops/transformer.cpp) and the registration
// of `activation`.
#include "core/error.hpp"
#include "nn/layers.hpp"
#include "nn/op_registry.hpp"
#include "nn/transformer_layers.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {

using kernels::Activation;

// ---- activations -----------------------------------------------------------------------

const Tensor& ReLU::forward(Context& ctx, const Tensor& x) {
  const Tensor& xi = in_dtype(ctx, x, xin_);
  Tensor& y = y_.ensure(xi.shape, xi.dtype);
  ctx.backend.relu(xi, y);
  return y;
}

const Tensor& ReLU::backward(Context& ctx, const Tensor& dy) {
  Tensor& dx = dx_.ensure(dy.shape, dtype(ctx));
  Tensor dy_c = dy;
  if (dy.dtype != dx.dtype) {  // gradient arriving in fp32 from an fp32 layer
    ctx.backend.cast(dy, dx);
    dy_c = dx;
  }
  ctx.backend.relu_backward(y_.view, dy_c, dx);
  return dx;
}

const Tensor& GELU::forward(Context& ctx, const Tensor& x) {
  x_ = in_dtype(ctx, x, xin_);
  Tensor& y = y_.ensure(x_.shape, out_dtype(ctx));
  ctx.backend.gelu(x_, y);
  return y;
}

const Tensor& GELU::backward(Context& ctx, const Tensor& dy) {
  Tensor& dx = dx_.ensure(dy.shape, dtype(ctx));
  ctx.backend.gelu_backward(x_, dy, dx);
  return dx;
}

const Tensor& Pointwise::forward(Context& ctx, const Tensor& x) {
  x_ = in_dtype(ctx, x, xin_);
  Tensor& y = y_.ensure(x_.shape, out_dtype(ctx));
  ctx.backend.unary(kernel_, x_, y);
  return y;
}

const Tensor& Pointwise::backward(Context& ctx, const Tensor& dy) {
  Tensor& dx = dx_.ensure(dy.shape, dtype(ctx));
  ctx.backend.unary_backward(kernel_, x_, dy, dx);
  return dx;
}

// ---- registration ----------------------------------------------------------------------

namespace {

RINGTRAIN_REGISTER_OP(activation, OpDef{.name = "activation",
                                        .infer = [](const OpNode& n) -> Shape {
                                          const auto k = n.def.activation().kind();
                                          RT_REQUIRE(
                                              k == pb::RELU || k == pb::GELU || k == pb::GELU_TANH,
                                              "activation kind ", pb::Activation_Name(k),
                                              " is not valid; expected RELU, GELU or GELU_TANH");
                                          return n.inputs[0];
                                        },
                                        .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
                                          if (n.def.activation().kind() == pb::GELU)
                                            return std::make_unique<GELU>(n.name);
                                          if (n.def.activation().kind() == pb::GELU_TANH)
                                            return std::make_unique<GeluTanh>(n.name);
                                          return std::make_unique<ReLU>(n.name);
                                        },
                                        .flops = nullptr});

}  // namespace

}  // namespace ringtrain
