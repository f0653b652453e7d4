// The pooling ops: MaxPool2D and GlobalAvgPool and the registrations of `max_pool` and
// `global_avg_pool`.
#include "core/error.hpp"
#include "nn/layers.hpp"
#include "nn/onnx_writer.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {

using kernels::Activation;

const Tensor& MaxPool2D::forward(Context& ctx, const Tensor& x) {
  RT_REQUIRE(x.shape.size() == 4 && x.dim(2) >= kernel_ && x.dim(3) >= kernel_, "layer ", name(),
             " expects input [N, C, H, W] with H, W >= ", kernel_, ", got ", shape_str(x.shape));
  ps_ = {x.dim(0), x.dim(1), x.dim(2), x.dim(3), kernel_, stride_, relu_input_};
  if (x_blocked_) ps_.x_layout = ctx.backend.activation_layout(ctx.compute);
  x_shape_ = x.shape;
  const Tensor& xi = in_dtype(ctx, x, xin_);
  const Shape ys{ps_.n, ps_.c, ps_.p(), ps_.q()};
  Tensor& y = y_.ensure(ys, xi.dtype);
  ctx.backend.maxpool2d_forward(ps_, xi, y, argmax_.ensure(ys, DType::i32));
  return y;
}

const Tensor& MaxPool2D::backward(Context& ctx, const Tensor& dy) {
  Tensor& dx = dx_.ensure(x_shape_, dtype(ctx));
  Tensor g = dy;
  if (dy.dtype != dx.dtype) {
    g = dy_cast_.ensure(dy.shape, dx.dtype);
    ctx.backend.cast(dy, g);
  }
  ctx.backend.maxpool2d_backward(ps_, g, argmax_.view, dx);
  return dx;
}

const Tensor& GlobalAvgPool::forward(Context& ctx, const Tensor& x) {
  RT_REQUIRE(x.shape.size() == 4, "layer ", name(), " expects input [N, C, H, W], got ",
             shape_str(x.shape));
  x_shape_ = x.shape;
  Tensor& y = y_.ensure({x.dim(0), x.dim(1)}, out_dtype(ctx));
  ctx.backend.avgpool_global_forward(x, y);
  return y;
}

const Tensor& GlobalAvgPool::backward(Context& ctx, const Tensor& dy) {
  Tensor& dx = dx_.ensure(x_shape_, dtype(ctx));
  ctx.backend.avgpool_global_backward(dy, dx);
  return dx;
}

// ---- registration ----------------------------------------------------------------------

namespace {

int64_t pool_stride(const pb::MaxPool& o) { return o.has_stride() ? o.stride() : o.kernel(); }

RINGTRAIN_REGISTER_OP(
    max_pool, OpDef{.name = "max_pool",
                    .infer = [](const OpNode& n) -> Shape {
                      const Shape& x = n.inputs[0];
                      const auto& o = n.def.max_pool();
                      RT_REQUIRE(o.kernel() >= 1, "kernel ", o.kernel(),
                                 " is not valid; expected a positive number");
                      RT_REQUIRE(pool_stride(o) >= 1, "stride ", pool_stride(o),
                                 " is not valid; expected a positive number");
                      RT_REQUIRE(x.size() == 3 && x[1] >= o.kernel() && x[2] >= o.kernel(),
                                 "max_pool expects input [C, H, W] with H, W >= ", o.kernel(),
                                 ", got ", shape_str(x));
                      const kernels::PoolShape ps{1, x[0], x[1], x[2], o.kernel(), pool_stride(o)};
                      return {x[0], ps.p(), ps.q()};
                    },
                    .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
                      const auto& o = n.def.max_pool();
                      return std::make_unique<MaxPool2D>(n.name, o.kernel(), pool_stride(o));
                    },
                    .flops =
                        [](const OpNode& n, const Shape& out) {
                          const int64_t k = n.def.max_pool().kernel();
                          return double(shape_numel(out) * k * k);
                        },
                    .onnx =
                        [](const OpNode& n, OnnxWriter& w) {
                          const auto& o = n.def.max_pool();
                          const int64_t s = pool_stride(o);
                          w.node("MaxPool", w.output(), {w.input(0)}, {w.output()},
                                 {{"kernel_shape", std::vector<int64_t>{o.kernel(), o.kernel()}},
                                  {"strides", std::vector<int64_t>{s, s}}});
                          return w.output();
                        }});

RINGTRAIN_REGISTER_OP(
    global_avg_pool,
    OpDef{.name = "global_avg_pool",
          .infer = [](const OpNode& n) -> Shape {
            const Shape& x = n.inputs[0];
            RT_REQUIRE(x.size() == 3, "global_avg_pool expects input [C, H, W], got ",
                       shape_str(x));
            return {x[0]};
          },
          .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
            return std::make_unique<GlobalAvgPool>(n.name);
          },
          .flops = [](const OpNode& n, const Shape&) { return double(shape_numel(n.inputs[0])); },
          .onnx = [](const OpNode&, OnnxWriter& w) {  // ONNX keeps [N, C, 1, 1]; ours is [N, C]
            const std::string p = w.op("GlobalAveragePool", w.output() + "/pool", {w.input(0)});
            w.node("Flatten", w.output(), {p}, {w.output()}, {{"axis", int64_t(1)}});
            return w.output();
          }});

}  // namespace

}  // namespace ringtrain
