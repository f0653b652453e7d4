// The Llama ops: RmsNorm, Mul and GroupedQueryAttention (declared in nn/llama_layers.hpp), and
// the registrations of `rms_norm` and `mul` (attention's three-input form is registered with
// `attention` in nn/ops/transformer.cpp, which builds a GroupedQueryAttention for it).
#include <cmath>

#include "core/error.hpp"
#include "nn/llama_layers.hpp"
#include "nn/onnx_writer.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {

// ---- RmsNorm ---------------------------------------------------------------------------

std::vector<ParamSpec> RmsNorm::param_specs() const {
  ParamSpec g{"weight", {c_}, 1, Init::ones};
  g.decay = false;
  g.reads_fp32 = true;
  return {g};
}

void RmsNorm::bind(std::vector<Param*> params) {
  RT_CHECK(params.size() == 1, "RmsNorm binds 1 param, got ", params.size());
  weight_ = params[0];
}

const Tensor& RmsNorm::forward(Context& ctx, const Tensor& x) {
  RT_REQUIRE(!x.shape.empty() && x.shape.back() == c_, "layer ", name(), " normalises ", c_,
             " features, got input ", shape_str(x.shape));
  x_ = in_dtype(ctx, x, xin_);
  const int64_t rows = x.numel() / c_;
  Tensor& y = y_.ensure(x.shape, out_dtype(ctx));
  ctx.backend.rmsnorm_forward(x_, weight_->master, eps_, y, rstd_.ensure({rows}, DType::f32));
  return y;
}

const Tensor& RmsNorm::backward(Context& ctx, const Tensor& dy_in) {
  const DType d = dtype(ctx);
  Tensor dy = dy_in;
  if (dy.dtype != d) {  // a gradient arriving in fp32 from an fp32 layer
    dy = dyc_.ensure(dy_in.shape, d);
    ctx.backend.cast(dy_in, dy);
  }
  Tensor& dx = dx_.ensure(x_.shape, d);
  MemoryScope in(MemCategory::gradients);  // the parameter's fp32 gradient
  Tensor& dw = dweight_.ensure({c_}, DType::f32);
  ctx.backend.rmsnorm_backward(x_, dy, weight_->master, rstd_.view, dx, dw);
  ctx.backend.cast(dw, weight_->grad);
  return dx;
}

// ---- Mul -------------------------------------------------------------------------------

const Tensor& Mul::forward(Context&, const Tensor&) {
  throw_runtime(__FILE__, __LINE__, cat("mul node ", name(), " was called with one input"));
}

const Tensor& Mul::backward(Context&, const Tensor&) {
  throw_runtime(__FILE__, __LINE__, cat("mul node ", name(), " was called with one input"));
}

const Tensor& Mul::forward_inputs(Context& ctx, const std::vector<const Tensor*>& xs) {
  RT_REQUIRE(xs.size() == 2 && xs[0]->shape == xs[1]->shape, "mul node ", name(),
             " takes two inputs of one shape; got ", shape_str(xs[0]->shape), " and ",
             shape_str(xs.back()->shape));
  a_ = in_dtype(ctx, *xs[0], ain_);
  b_ = in_dtype(ctx, *xs[1], bin_);
  Tensor& y = y_.ensure(a_.shape, out_dtype(ctx));
  ctx.backend.mul(a_, b_, y);
  return y;
}

void Mul::backward_inputs(Context& ctx, const Tensor& dy_in, std::vector<Tensor>& dxs) {
  const DType d = dtype(ctx);
  Tensor dy = dy_in;
  if (dy.dtype != d) {
    dy = dyc_.ensure(dy_in.shape, d);
    ctx.backend.cast(dy_in, dy);
  }
  Tensor& da = da_.ensure(a_.shape, d);
  Tensor& db = db_.ensure(b_.shape, d);
  ctx.backend.mul_backward(a_, b_, dy, da, db);
  dxs.assign({da, db});
}

// ---- GroupedQueryAttention -------------------------------------------------------------

const Tensor& GroupedQueryAttention::forward(Context&, const Tensor&) {
  throw_runtime(__FILE__, __LINE__, cat("attention node ", name(), " was called with one input"));
}

const Tensor& GroupedQueryAttention::backward(Context&, const Tensor&) {
  throw_runtime(__FILE__, __LINE__, cat("attention node ", name(), " was called with one input"));
}

const Tensor& GroupedQueryAttention::forward_inputs(Context& ctx,
                                                    const std::vector<const Tensor*>& xs) {
  const int64_t c = cfg_.heads * cfg_.head_dim, kvc = cfg_.kv_heads * cfg_.head_dim;
  RT_REQUIRE(xs.size() == 3 && xs[0]->shape.size() == 3 && xs[0]->dim(2) == c &&
                 xs[1]->shape == Shape({xs[0]->dim(0), xs[0]->dim(1), kvc}) &&
                 xs[2]->shape == xs[1]->shape,
             "layer ", name(), " takes q [batch, T, ", c, "], k and v [batch, T, ", kvc, "]; got ",
             shape_str(xs[0]->shape), ", ", shape_str(xs[1]->shape), ", ",
             shape_str(xs.back()->shape));
  const Tensor& q = in_dtype(ctx, *xs[0], qin_);
  const Tensor& k = in_dtype(ctx, *xs[1], kin_);
  const Tensor& v = in_dtype(ctx, *xs[2], vin_);
  kv_shape_ = k.shape;
  const int64_t b = q.dim(0), t = q.dim(1);
  const DType d = dtype(ctx);
  Tensor& qkv = qkv_.ensure({b, t, 3 * c}, d);
  ctx.backend.rope_pack(cfg_, q, k, v, qkv);
  Tensor& y = y_.ensure({b, t, c}, d);
  ctx.backend.attention_forward(cfg_.heads, qkv, y, lse_.ensure({b, cfg_.heads, t}, DType::f32));
  if (out_dtype(ctx) == y.dtype) return y;
  Tensor& out = yout_.ensure(y.shape, out_dtype(ctx));
  ctx.backend.cast(y, out);
  return out;
}

void GroupedQueryAttention::backward_inputs(Context& ctx, const Tensor& dy_in,
                                            std::vector<Tensor>& dxs) {
  const DType d = dtype(ctx);
  Tensor dy = dy_in;
  if (dy.dtype != d) {
    dy = dyc_.ensure(dy_in.shape, d);
    ctx.backend.cast(dy_in, dy);
  }
  const Tensor& qkv = qkv_.view;
  Tensor& dqkv = dqkv_.ensure(qkv.shape, d);
  ctx.backend.attention_backward(cfg_.heads, qkv, y_.view, dy, lse_.view, dqkv);
  Tensor& dq = dq_.ensure(y_.view.shape, d);
  Tensor& dk = dk_.ensure(kv_shape_, d);
  Tensor& dv = dv_.ensure(kv_shape_, d);
  ctx.backend.rope_pack_backward(cfg_, dqkv, dq, dk, dv);
  dxs.assign({dq, dk, dv});
}

// ---- registration ----------------------------------------------------------------------

namespace {

float rms_eps(const pb::RmsNorm& o) { return o.has_eps() ? float(o.eps()) : 1e-6f; }

// x / sqrt(mean(x^2) + eps) * weight, as ReduceMean/Sqrt/Div (opset 17 has no RMSNormalization).
std::string rms_norm_onnx(const OpNode& n, OnnxWriter& w) {
  const std::string x = w.input(0), p = w.output();
  const std::string ms = w.op("ReduceMean", p + "/mean_sq", {w.op("Mul", p + "/sq", {x, x})},
                              {{"axes", std::vector<int64_t>{-1}}, {"keepdims", int64_t(1)}});
  const std::string rms = w.op("Sqrt", p + "/rms",
                               {w.op("Add", p + "/mean_sq_eps",
                                     {ms, w.scalar(cat("const/eps_", rms_eps(n.def.rms_norm())),
                                                   rms_eps(n.def.rms_norm()))})});
  const std::string xn = w.op("Div", p + "/normed", {x, rms});
  w.node("Mul", p, {xn, w.param("weight")}, {p});
  return p;
}

RINGTRAIN_REGISTER_OP(
    rms_norm,
    OpDef{.name = "rms_norm",
          .infer = [](const OpNode& n) -> Shape {
            RT_REQUIRE(!n.inputs[0].empty(), "rms_norm needs an input with features");
            RT_REQUIRE(rms_eps(n.def.rms_norm()) > 0, "eps ", n.def.rms_norm().eps(),
                       " is not positive");
            return n.inputs[0];
          },
          .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
            return std::make_unique<RmsNorm>(n.name, n.inputs[0].back(), rms_eps(n.def.rms_norm()));
          },
          // x^2, the row sum, x * rstd, * weight
          .flops = [](const OpNode&, const Shape& out) { return 4.0 * double(shape_numel(out)); },
          .onnx = rms_norm_onnx});

RINGTRAIN_REGISTER_OP(mul,
                      OpDef{.name = "mul",
                            .min_inputs = 2,
                            .max_inputs = 2,
                            .infer = [](const OpNode& n) -> Shape {
                              RT_REQUIRE(n.inputs[0] == n.inputs[1],
                                         "mul takes two inputs of one shape; got ",
                                         shape_str(n.inputs[0]), " and ", shape_str(n.inputs[1]));
                              return n.inputs[0];
                            },
                            .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
                              return std::make_unique<Mul>(n.name);
                            },
                            .onnx =
                                [](const OpNode&, OnnxWriter& w) {
                                  w.node("Mul", w.output(), {w.input(0), w.input(1)}, {w.output()});
                                  return w.output();
                                }});

}  // namespace

}  // namespace ringtrain
