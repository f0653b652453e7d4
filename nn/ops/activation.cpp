// The activation op: ReLU, GELU and the kernel table's Pointwise layers (GeluTanh:
// nn/ops/transformer.cpp), the activation kinds a model file names with the layer and ONNX
// form of each, and the registration of `activation`.
#include <cmath>

#include "core/error.hpp"
#include "nn/layers.hpp"
#include "nn/onnx_writer.hpp"
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

// One activation kind of a model file (`activation { kind: K }`): the layer it builds and
// its ONNX (opset 17) form, y = f(x) written as `out`. A pointwise activation of the kernel
// table is a Pointwise layer of its kernel name; adding one is a row here
// (docs/architecture.md, "Adding an op").
struct ActivationKind {
  pb::Activation kind;
  std::unique_ptr<Layer> (*layer)(const std::string& name);
  std::string (*onnx)(OnnxWriter& w, const std::string& x, const std::string& out);
};

const ActivationKind kActivationKinds[] = {
    {pb::RELU,
     [](const std::string& name) -> std::unique_ptr<Layer> { return std::make_unique<ReLU>(name); },
     [](OnnxWriter& w, const std::string& x, const std::string& out) {
       return w.op("Relu", out, {x});
     }},
    {pb::GELU,
     [](const std::string& name) -> std::unique_ptr<Layer> { return std::make_unique<GELU>(name); },
     [](OnnxWriter& w, const std::string& x, const std::string& out) {
       // 0.5 x (1 + erf(x / sqrt 2)): opset 17 has no Gelu
       const std::string e =
           w.op("Erf", out + "/erf",
                {w.op("Div", out + "/scaled", {x, w.scalar("const/sqrt2", float(M_SQRT2))})});
       const std::string one = w.op("Add", out + "/one_plus", {e, w.scalar("const/one", 1.f)});
       return w.op("Mul", out,
                   {w.op("Mul", out + "/x_times", {x, one}), w.scalar("const/half", 0.5f)});
     }},
    {pb::GELU_TANH,
     [](const std::string& name) -> std::unique_ptr<Layer> {
       return std::make_unique<GeluTanh>(name);
     },
     [](OnnxWriter& w, const std::string& x, const std::string& out) {
       // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's form
       const std::string x3 = w.op("Mul", out + "/cube", {w.op("Mul", out + "/square", {x, x}), x});
       const std::string inner =
           w.op("Add", out + "/inner",
                {x, w.op("Mul", out + "/cubic", {x3, w.scalar("const/gelu_cubic", 0.044715f)})});
       const std::string th =
           w.op("Tanh", out + "/tanh",
                {w.op("Mul", out + "/scaled",
                      {inner, w.scalar("const/sqrt_2_over_pi", 0.7978845608028654f)})});
       const std::string one = w.op("Add", out + "/one_plus", {th, w.scalar("const/one", 1.f)});
       return w.op("Mul", out,
                   {w.op("Mul", out + "/x_times", {x, one}), w.scalar("const/half", 0.5f)});
     }},
    {pb::SILU,
     [](const std::string& name) -> std::unique_ptr<Layer> {
       return std::make_unique<Pointwise>(name, "silu");
     },
     [](OnnxWriter& w, const std::string& x, const std::string& out) {
       // x sigmoid(x): opset 17 has no Silu
       return w.op("Mul", out, {x, w.op("Sigmoid", out + "/sigmoid", {x})});
     }},
};

const ActivationKind& activation_kind(pb::Activation k) {
  std::string valid;
  for (const ActivationKind& a : kActivationKinds) {
    if (a.kind == k) return a;
    valid += cat(valid.empty() ? "" : ", ", pb::Activation_Name(a.kind));
  }
  throw_input(
      cat("activation kind ", pb::Activation_Name(k), " is not valid; expected one of ", valid));
}

RINGTRAIN_REGISTER_OP(activation,
                      OpDef{.name = "activation",
                            .infer = [](const OpNode& n) -> Shape {
                              activation_kind(n.def.activation().kind());
                              return n.inputs[0];
                            },
                            .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
                              return activation_kind(n.def.activation().kind()).layer(n.name);
                            },
                            .flops = nullptr,
                            .onnx =
                                [](const OpNode& n, OnnxWriter& w) {
                                  return write_onnx_activation(w, n.def.activation().kind(),
                                                               w.input(0), w.output());
                                }});

}  // namespace

std::string write_onnx_activation(OnnxWriter& w, pb::Activation kind, const std::string& x,
                                  const std::string& out) {
  return kind == pb::NONE ? x : activation_kind(kind).onnx(w, x, out);
}

}  // namespace ringtrain
