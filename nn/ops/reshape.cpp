// The reshaping ops (views, no copies): Flatten and Reshape, and the registrations of
// `flatten` and `reshape`.
#include "core/error.hpp"
#include "nn/layers.hpp"
#include "nn/onnx_writer.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {

const Tensor& Flatten::forward(Context&, const Tensor& x) {
  x_shape_ = x.shape;
  y_ = Tensor(x.data, {x.dim(0), x.numel() / std::max<int64_t>(1, x.dim(0))}, x.dtype, x.device);
  return y_;
}

const Tensor& Flatten::backward(Context&, const Tensor& dy) {
  dx_ = Tensor(dy.data, x_shape_, dy.dtype, dy.device);
  return dx_;
}

const Tensor& Reshape::forward(Context&, const Tensor& x) {
  x_shape_ = x.shape;
  Shape s{x.dim(0)};
  s.insert(s.end(), shape_.begin(), shape_.end());
  y_ = Tensor(x.data, s, x.dtype, x.device);
  return y_;
}

const Tensor& Reshape::backward(Context&, const Tensor& dy) {
  dx_ = Tensor(dy.data, x_shape_, dy.dtype, dy.device);
  return dx_;
}

// ---- registration ----------------------------------------------------------------------

namespace {

// The shape `r` asks for, with its -1 resolved against `numel` elements.
Shape resolve_reshape(const google::protobuf::RepeatedField<int64_t>& r, int64_t numel) {
  Shape s(r.begin(), r.end());
  RT_REQUIRE(!s.empty(), "reshape needs a shape");
  int64_t known = 1, free_dim = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      RT_REQUIRE(free_dim < 0, "reshape shape ", shape_str(s), " has more than one -1");
      free_dim = int64_t(i);
      continue;
    }
    RT_REQUIRE(s[i] >= 1, "reshape shape ", shape_str(s), " has a dimension below 1");
    known *= s[i];
  }
  if (free_dim >= 0) {
    RT_REQUIRE(numel % known == 0, "reshape shape ", shape_str(s), " does not divide ", numel,
               " elements");
    s[size_t(free_dim)] = numel / known;
  }
  RT_REQUIRE(shape_numel(s) == numel, "reshape shape ", shape_str(s), " holds ", shape_numel(s),
             " elements but the input has ", numel);
  return s;
}

RINGTRAIN_REGISTER_OP(
    flatten,
    OpDef{.name = "flatten",
          .infer = [](const OpNode& n) -> Shape { return {shape_numel(n.inputs[0])}; },
          .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
            return std::make_unique<Flatten>(n.name);
          },
          .flops = [](const OpNode&, const Shape&) { return 0.0; },
          .onnx =
              [](const OpNode&, OnnxWriter& w) {
                w.node("Flatten", w.output(), {w.input(0)}, {w.output()}, {{"axis", int64_t(1)}});
                return w.output();
              }});

RINGTRAIN_REGISTER_OP(
    reshape,
    OpDef{.name = "reshape",
          .infer = [](const OpNode& n) -> Shape {
            return resolve_reshape(n.def.reshape().shape(), shape_numel(n.inputs[0]));
          },
          .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
            return std::make_unique<Reshape>(
                n.name, resolve_reshape(n.def.reshape().shape(), shape_numel(n.inputs[0])));
          },
          .flops = [](const OpNode&, const Shape&) { return 0.0; },
          .onnx =
              [](const OpNode& n, OnnxWriter& w) {
                // 0: the batch dimension as it is
                std::vector<int64_t> shape = {0};
                const Shape s = resolve_reshape(n.def.reshape().shape(), shape_numel(n.inputs[0]));
                shape.insert(shape.end(), s.begin(), s.end());
                return w.op("Reshape", w.output(),
                            {w.input(0), w.ints(w.output() + "/shape", shape)});
              }});

}  // namespace

}  // namespace ringtrain
