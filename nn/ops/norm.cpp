// The normalisation op: BatchNorm2D and the registration of `batch_norm`.
#include "core/error.hpp"
#include "nn/layers.hpp"
#include "nn/onnx_writer.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {

using kernels::Activation;

// ---- BatchNorm2D -----------------------------------------------------------------------

std::vector<ParamSpec> BatchNorm2D::param_specs() const {
  return {{"weight", {c_}, 1, Init::ones, 1, 0, false, true},
          {"bias", {c_}, 1, Init::zeros, 1, 0, false, true}};
}

std::vector<ParamSpec> BatchNorm2D::buffer_specs() const {
  return {{"running_mean", {c_}, 1, Init::zeros}, {"running_var", {c_}, 1, Init::ones}};
}

void BatchNorm2D::bind(std::vector<Param*> params) {
  RT_CHECK(params.size() == 2, "BatchNorm2D binds 2 params, got ", params.size());
  gamma_ = params[0];
  beta_ = params[1];
}

void BatchNorm2D::bind_buffers(std::vector<StateBuffer*> buffers) {
  RT_CHECK(buffers.size() == 2, "BatchNorm2D binds 2 buffers, got ", buffers.size());
  running_mean_ = buffers[0];
  running_var_ = buffers[1];
}

const Tensor& BatchNorm2D::forward(Context& ctx, const Tensor& x) {
  RT_REQUIRE(x.shape.size() == 4 && x.dim(1) == c_, "layer ", name(), " expects input [N, ", c_,
             ", H, W], got ", shape_str(x.shape));
  training_ = ctx.training;
  x_ = in_dtype(ctx, x, xin_);
  Tensor& y = y_.ensure(x.shape, out_dtype(ctx));
  Tensor mean = running_mean_->value, var = running_var_->value;
  if (ctx.recomputing && training_) {
    // The running averages were updated by this step's first forward; the recomputation
    // updates a copy, so they move once per step as without it.
    Tensor& copy = running_copy_.ensure({2, c_}, DType::f32);
    mean = copy.slice(0, {c_});
    var = copy.slice(c_, {c_});
    ctx.backend.cast(running_mean_->value, mean);
    ctx.backend.cast(running_var_->value, var);
  }
  ctx.backend.batchnorm_forward(cfg_, training_, x_, gamma_->master, beta_->master, mean, var, y,
                                mean_.ensure({c_}, DType::f32), invstd_.ensure({c_}, DType::f32));
  return y;
}

const Tensor& BatchNorm2D::backward(Context& ctx, const Tensor& dy) {
  Tensor& dx = dx_.ensure(x_.shape, dtype(ctx));
  MemoryScope in(MemCategory::gradients);  // the parameters' fp32 gradients
  Tensor& dg = dgamma_.ensure({c_}, DType::f32);
  Tensor& db = dbeta_.ensure({c_}, DType::f32);
  ctx.backend.batchnorm_backward(training_, x_, dy, gamma_->master, mean_.view, invstd_.view, dx,
                                 dg, db);
  // fp32 gradients into the flat gradient buffer (compute dtype), for the reduction.
  ctx.backend.cast(dg, gamma_->grad);
  ctx.backend.cast(db, beta_->grad);
  return dx;
}

// ---- registration ----------------------------------------------------------------------

namespace {

kernels::BatchNormConfig bn_config(const pb::BatchNorm& o) {
  kernels::BatchNormConfig c;
  if (o.has_momentum()) c.momentum = float(o.momentum());
  if (o.has_eps()) c.eps = float(o.eps());
  return c;
}

RINGTRAIN_REGISTER_OP(
    batch_norm,
    OpDef{.name = "batch_norm",
          .infer = [](const OpNode& n) -> Shape {
            const Shape& x = n.inputs[0];
            RT_REQUIRE(x.size() == 3, "batch_norm expects input [C, H, W], got ", shape_str(x));
            const auto c = bn_config(n.def.batch_norm());
            RT_REQUIRE(c.momentum >= 0 && c.momentum <= 1, "momentum ", c.momentum,
                       " is not in [0, 1]");
            RT_REQUIRE(c.eps > 0, "eps ", c.eps, " is not positive");
            return x;
          },
          .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
            return std::make_unique<BatchNorm2D>(n.name, n.inputs[0][0],
                                                 bn_config(n.def.batch_norm()));
          },
          .flops = [](const OpNode&, const Shape& out) { return 4.0 * double(shape_numel(out)); },
          // the inference form, on the running statistics
          .onnx =
              [](const OpNode& n, OnnxWriter& w) {
                w.node("BatchNormalization", w.output(),
                       {w.input(0), w.param("weight"), w.param("bias"), w.buffer("running_mean"),
                        w.buffer("running_var")},
                       {w.output()}, {{"epsilon", bn_config(n.def.batch_norm()).eps}});
                return w.output();
              }});

}  // namespace

}  // namespace ringtrain
