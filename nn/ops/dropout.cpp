// The dropout op: Dropout (inverted, counter-based masks) and the registration of `dropout`.
#include "core/error.hpp"
#include "core/rng.hpp"
#include "nn/layers.hpp"
#include "nn/onnx_writer.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {

using kernels::Activation;

// ---- Dropout ---------------------------------------------------------------------------

const Tensor& Dropout::forward(Context& ctx, const Tensor& x) {
  dropped_ = ctx.training && p_ > 0.f;
  if (!dropped_) {
    pass_ = x;
    return pass_;
  }
  Tensor& y = y_.ensure(x.shape, x.dtype);
  ctx.backend.dropout_forward(x, p_, mix_seed(ctx.dropout_seed, hash_name(name())), y,
                              mask_.ensure(x.shape, DType::u8));
  return y;
}

const Tensor& Dropout::backward(Context& ctx, const Tensor& dy) {
  if (!dropped_) {
    pass_ = dy;
    return pass_;
  }
  Tensor& dx = dx_.ensure(dy.shape, dy.dtype);
  ctx.backend.dropout_backward(dy, mask_.view, p_, dx);
  return dx;
}

// ---- registration ----------------------------------------------------------------------

namespace {

RINGTRAIN_REGISTER_OP(dropout,
                      OpDef{.name = "dropout",
                            .infer = [](const OpNode& n) -> Shape {
                              const float p = n.def.dropout().p();
                              RT_REQUIRE(p >= 0 && p < 1, "p ", p,
                                         " is not a probability in [0, 1)");
                              return n.inputs[0];
                            },
                            .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
                              return std::make_unique<Dropout>(n.name, n.def.dropout().p());
                            },
                            .flops = nullptr,
                            // identity in inference: no node
                            .onnx = [](const OpNode&, OnnxWriter& w) { return w.input(0); }});

}  // namespace

}  // namespace ringtrain
