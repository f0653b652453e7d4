// The ops of several inputs: Add (elementwise sum, the residual connection) and Concat (along
// the channel axis), and the registrations of `add` and `concat`.
#include "core/error.hpp"
#include "nn/layers.hpp"
#include "nn/onnx_writer.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {

// ---- Add -------------------------------------------------------------------------------

const Tensor& Add::forward(Context&, const Tensor&) {
  throw_runtime(__FILE__, __LINE__, cat("add node ", name(), " was called with one input"));
}

const Tensor& Add::backward(Context&, const Tensor&) {
  throw_runtime(__FILE__, __LINE__, cat("add node ", name(), " was called with one input"));
}

const Tensor& Add::forward_inputs(Context& ctx, const std::vector<const Tensor*>& xs) {
  inputs_ = xs.size();
  for (const Tensor* x : xs)
    RT_REQUIRE(x->shape == xs[0]->shape, "add node ", name(), ": input shapes ",
               shape_str(xs[0]->shape), " and ", shape_str(x->shape), " differ");
  Tensor& y = y_.ensure(xs[0]->shape, out_dtype(ctx));
  ctx.backend.add(*xs[0], *xs[1], y);
  for (size_t i = 2; i < xs.size(); ++i) ctx.backend.add(y, *xs[i], y);
  return y;
}

void Add::backward_inputs(Context&, const Tensor& dy, std::vector<Tensor>& dxs) {
  dxs.assign(inputs_, dy);  // d(x0 + x1)/dxi = 1
}

// ---- Concat ----------------------------------------------------------------------------

const Tensor& Concat::forward(Context&, const Tensor&) {
  throw_runtime(__FILE__, __LINE__, cat("concat node ", name(), " was called with one input"));
}

const Tensor& Concat::backward(Context&, const Tensor&) {
  throw_runtime(__FILE__, __LINE__, cat("concat node ", name(), " was called with one input"));
}

namespace {

// Elements of one sample from dimension 1 on, and the rest after dimension 1.
int64_t per_sample(const Shape& s) { return shape_numel(s) / std::max<int64_t>(1, s[0]); }

}  // namespace

const Tensor& Concat::forward_inputs(Context& ctx, const std::vector<const Tensor*>& xs) {
  shapes_.clear();
  Shape ys = xs[0]->shape;
  ys[1] = 0;
  for (const Tensor* x : xs) {
    shapes_.push_back(x->shape);
    ys[1] += x->dim(1);
  }
  Tensor& y = y_.ensure(ys, out_dtype(ctx));
  const int64_t n = ys[0], row = per_sample(ys);
  // One block copy (a cast when the dtypes differ) per sample and input: any backend.
  int64_t at = 0;
  for (const Tensor* x : xs) {
    const int64_t len = per_sample(x->shape);
    for (int64_t s = 0; s < n; ++s)
      ctx.backend.cast(x->slice(s * len, {len}), y.slice(s * row + at, {len}));
    at += len;
  }
  return y;
}

void Concat::backward_inputs(Context& ctx, const Tensor& dy, std::vector<Tensor>& dxs) {
  dx_.resize(shapes_.size());
  dxs.clear();
  const int64_t n = dy.dim(0), row = per_sample(dy.shape);
  int64_t at = 0;
  for (size_t i = 0; i < shapes_.size(); ++i) {
    Tensor& dx = dx_[i].ensure(shapes_[i], dtype(ctx));
    const int64_t len = per_sample(shapes_[i]);
    for (int64_t s = 0; s < n; ++s)
      ctx.backend.cast(dy.slice(s * row + at, {len}), dx.slice(s * len, {len}));
    at += len;
    dxs.push_back(dx);
  }
}

std::vector<OwnedTensor*> Concat::activation_buffers() {
  std::vector<OwnedTensor*> out{&y_};
  for (auto& d : dx_) out.push_back(&d);
  return out;
}

// ---- registration ----------------------------------------------------------------------

namespace {

RINGTRAIN_REGISTER_OP(add, OpDef{.name = "add",
                                 .min_inputs = 2,
                                 .max_inputs = -1,
                                 .infer = [](const OpNode& n) -> Shape {
                                   for (size_t i = 1; i < n.inputs.size(); ++i)
                                     RT_REQUIRE(n.inputs[i] == n.inputs[0],
                                                "add needs inputs of one shape; input 1 is ",
                                                shape_str(n.inputs[0]), " but input ", i + 1,
                                                " is ", shape_str(n.inputs[i]));
                                   return n.inputs[0];
                                 },
                                 .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
                                   return std::make_unique<Add>(n.name);
                                 },
                                 .flops = nullptr,
                                 .onnx =
                                     [](const OpNode& n, OnnxWriter& w) {
                                       // a chain of two-input Adds, the last one named as the node
                                       std::string acc = w.input(0);
                                       for (size_t k = 1; k < n.inputs.size(); ++k)
                                         acc = w.op("Add",
                                                    k + 1 == n.inputs.size()
                                                        ? w.output()
                                                        : cat(w.output(), "/sum", k),
                                                    {acc, w.input(k)});
                                       return acc;
                                     }});

RINGTRAIN_REGISTER_OP(
    concat, OpDef{.name = "concat",
                  .min_inputs = 2,
                  .max_inputs = -1,
                  .infer = [](const OpNode& n) -> Shape {
                    Shape out = n.inputs[0];
                    RT_REQUIRE(!out.empty(), "concat needs inputs with a channel axis");
                    for (size_t i = 1; i < n.inputs.size(); ++i) {
                      Shape a = n.inputs[0], b = n.inputs[i];
                      a[0] = b.empty() ? 0 : b[0];
                      RT_REQUIRE(a == b,
                                 "concat needs inputs that differ only in channels; input 1 is ",
                                 shape_str(n.inputs[0]), " but input ", i + 1, " is ",
                                 shape_str(n.inputs[i]));
                      out[0] += b[0];
                    }
                    return out;
                  },
                  .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
                    return std::make_unique<Concat>(n.name);
                  },
                  .flops = [](const OpNode&, const Shape&) { return 0.0; },
                  .onnx =
                      [](const OpNode& n, OnnxWriter& w) {
                        std::vector<std::string> ins;
                        for (size_t k = 0; k < n.inputs.size(); ++k) ins.push_back(w.input(k));
                        w.node("Concat", w.output(), ins, {w.output()}, {{"axis", int64_t(1)}});
                        return w.output();
                      }});

}  // namespace

}  // namespace ringtrain
