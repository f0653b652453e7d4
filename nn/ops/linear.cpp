// The linear op: Linear (y = act(x W^T + b)) and the registration of `linear`.
#include "core/error.hpp"
#include "nn/layers.hpp"
#include "nn/onnx_writer.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {

using kernels::Activation;

// ---- Linear ----------------------------------------------------------------------------

std::vector<ParamSpec> Linear::param_specs() const {
  const int64_t fan_in = fan_in_ ? fan_in_ : in_;
  std::vector<ParamSpec> specs{{"weight", {out_, in_}, fan_in, Init::fan_in_uniform, out_}};
  if (has_bias_)
    specs.push_back({"bias", {out_}, fan_in, Init::fan_in_uniform, out_, 0, false, true});
  return specs;
}

std::string Linear::split_tensor_parallel(TensorSplitRole role, int64_t groups,
                                          const TensorParallelGroup* group) {
  const int64_t t = group->size;
  if (act_ != Activation::none && role == TensorSplitRole::row)
    return "a row-parallel linear layer cannot fuse an activation (it applies to the sum)";
  if (role == TensorSplitRole::heads) return "a linear layer splits by columns or rows";
  const int part = group->rank, parts = int(t);
  if (role == TensorSplitRole::column) {
    if (out_ % (groups * t) != 0)
      return cat("its ", out_, " outputs do not divide into ", groups, " x ", t, " parts");
    weight_split_ = {0, groups, part, parts, {out_, in_}};
    bias_split_ = {0, groups, part, parts, {out_}};
    out_ /= t;
  } else {
    if (in_ % t != 0) return cat("its ", in_, " inputs do not divide into ", t, " parts");
    weight_split_ = {1, 1, part, parts, {out_, in_}};
    fan_in_ = in_;
    in_ /= t;
  }
  tp_ = group;
  tp_role_ = role;
  return "";
}

void Linear::bind(std::vector<Param*> params) {
  RT_CHECK(params.size() == (has_bias_ ? 2u : 1u), "Linear binds ", has_bias_ ? 2 : 1,
           " params, got ", params.size());
  weight_ = params[0];
  bias_ = has_bias_ ? params[1] : nullptr;
}

const Tensor& Linear::forward(Context& ctx, const Tensor& x) {
  // Rows: the samples, or with last_axis every position of every sample (tokens).
  const int64_t n = last_axis_ ? x.numel() / in_ : x.dim(0);
  RT_REQUIRE(x.numel() == n * in_ && (!last_axis_ || x.shape.back() == in_), "layer ", name(),
             " expects ", in_,
             last_axis_ ? " features in its last dimension" : " input features per sample",
             ", got input shape ", shape_str(x.shape));
  x_shape_ = x.shape;
  const Tensor& xi = in_dtype(ctx, x, xin_);
  x_ = Tensor(xi.data, {n, in_}, xi.dtype, xi.device);
  Tensor& y = y_.ensure({n, out_}, out_dtype(ctx));
  const Tensor& w = weights(ctx, *weight_, weight_cast_);
  // Row-parallel: the partial products are summed over the group, the bias added once.
  const bool row = tp_ && tp_role_ == TensorSplitRole::row;
  const Param* bias = row && tp_->rank != 0 ? nullptr : bias_;
  if (bias && act_ == Activation::none) {  // the bias from the fp32 masters
    ctx.backend.gemm_bias(false, true, x_, w, bias->master, y);
  } else {
    ctx.backend.gemm(false, true, 1.f, x_, w, 0.f, y);
    if (bias)
      ctx.backend.bias_add(y, bias->master, act_);
    else if (act_ == Activation::relu)
      ctx.backend.relu(y, y);
  }
  if (row) tp_->allreduce_sum(y);
  if (last_axis_) {  // computed as [rows, out]; returned with the leading dimensions of x
    y.shape = x.shape;
    y.shape.back() = out_;
  }
  return y;
}

const Tensor& Linear::backward(Context& ctx, const Tensor& dy_in) {
  Tensor dy = relu_masked(ctx, act_, y_.view, dy_in, dy_masked_);
  dy.shape = {x_.dim(0), out_};  // 2-D, whatever the leading dimensions
  const Tensor dw = grad_target(ctx, *weight_, dw_);
  ctx.backend.gemm(true, false, 1.f, dy, x_, 0.f, dw);  // dW = dy^T x
  commit_grad(ctx, *weight_, dw);
  if (bias_) ctx.backend.bias_grad(dy, bias_->grad);
  if (!needs_input_grad_) return dx_.view;
  Tensor& dx = dx_.ensure({dy.dim(0), in_}, dtype(ctx));
  ctx.backend.gemm(false, false, 1.f, dy, weights(ctx, *weight_, weight_cast_), 0.f,
                   dx);  // dx = dy W
  // Column-parallel: each rank's outputs contribute to the whole input's gradient.
  if (tp_ && tp_role_ == TensorSplitRole::column) tp_->allreduce_sum(dx);
  dx.shape = x_shape_;
  return dx;
}

// ---- registration ----------------------------------------------------------------------

Activation fused_activation(pb::Activation a) {
  RT_REQUIRE(a == pb::NONE || a == pb::RELU, "activation ", pb::Activation_Name(a),
             " cannot be fused here; expected NONE or RELU (use an activation node)");
  return a == pb::RELU ? Activation::relu : Activation::none;
}

namespace {

// Gemm (after a Flatten for inputs of more than one dimension); with last_axis, MatMul with
// the transposed weight and an Add of the bias; then the fused activation.
std::string linear_onnx(const OpNode& n, OnnxWriter& w) {
  const pb::Linear& o = n.def.linear();
  const std::string v = w.output();
  const bool bias = w.has_param("bias");
  const bool act = o.activation() != pb::NONE;
  const std::string y = act ? v + "/linear" : v;
  if (o.last_axis()) {  // [N, ..., in] -> [N, ..., out]: MatMul with W^T, then the bias
    const std::string wt = w.op("Transpose", v + "/weight_t", {w.param("weight")});  // reversed
    const std::string xw = w.op("MatMul", bias ? v + "/matmul" : y, {w.input(0), wt});
    if (bias) w.op("Add", y, {xw, w.param("bias")});
  } else {  // x viewed as [N, in_features]
    std::string x = w.input(0);
    if (n.inputs[0].size() != 1) {
      x = v + "/flatten";
      w.node("Flatten", x, {w.input(0)}, {x}, {{"axis", int64_t(1)}});
    }
    std::vector<std::string> ins = {x, w.param("weight")};
    if (bias) ins.push_back(w.param("bias"));
    w.node("Gemm", y, ins, {y}, {{"transB", int64_t(1)}});
  }
  return write_onnx_activation(w, o.activation(), y, v);
}

RINGTRAIN_REGISTER_OP(linear,
                      OpDef{.name = "linear",
                            .infer = [](const OpNode& n) -> Shape {
                              const auto& o = n.def.linear();
                              RT_REQUIRE(o.out_features() >= 1, "out_features ", o.out_features(),
                                         " is not valid; expected a positive number");
                              fused_activation(o.activation());
                              if (!o.last_axis()) return {o.out_features()};
                              Shape out = n.inputs[0];
                              RT_REQUIRE(!out.empty(),
                                         "last_axis needs an input with a last dimension");
                              out.back() = o.out_features();
                              return out;
                            },
                            .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
                              const auto& o = n.def.linear();
                              const int64_t in =
                                  o.last_axis() ? n.inputs[0].back() : shape_numel(n.inputs[0]);
                              return std::make_unique<Linear>(
                                  n.name, in, o.out_features(), fused_activation(o.activation()),
                                  !o.has_bias() || o.bias(), o.last_axis());
                            },
                            .flops =
                                [](const OpNode& n, const Shape& out) {
                                  // 2 in out per row (one row, or one per leading
                                  // position), and the bias's o when the layer has one
                                  const double o = double(out.back());
                                  const double rows = double(shape_numel(out)) / o;
                                  const double in = double(shape_numel(n.inputs[0])) / rows;
                                  const auto& l = n.def.linear();
                                  const bool bias = !l.has_bias() || l.bias();
                                  return rows * (2.0 * in * o + (bias ? o : 0.0));
                                },
                            .onnx = linear_onnx});

}  // namespace

}  // namespace ringtrain
