// Layer: the unit a Model is built from, and the layers of the MLP (Linear, ReLU).
// A layer owns its activations; its parameters and gradients are views into the Model's
// flat buffers (fp32 masters, compute-dtype working copy, compute-dtype gradients).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain {

// What a step runs with: the backend and the precision policy.
struct Context {
  kernels::Backend& backend;
  DType compute = DType::f32;  // working weights, activations, gradients
  bool training = true;
};

struct ParamSpec {
  std::string name;  // within the layer: "weight", "bias"
  Shape shape;
  int64_t fan_in = 1;  // init draws from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), like PyTorch
};

struct Param {
  std::string name;  // "<layer>.<param>", the checkpoint name
  Shape shape;
  int64_t offset = 0;  // in elements, into the flat buffers
  int64_t fan_in = 1;  // for the initialisation
  Tensor master;       // fp32
  Tensor work;         // compute dtype (aliases master in fp32)
  Tensor grad;         // compute dtype
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  const std::string& name() const { return name_; }
  virtual std::vector<ParamSpec> param_specs() const { return {}; }
  // Called once the Model has laid out the flat buffers; params in param_specs() order.
  virtual void bind(std::vector<Param*> params) {}
  // Output dtype override (the precision policy keeps the last layer's output in fp32).
  void set_output_dtype(DType t) {
    out_override_ = t;
    has_override_ = true;
  }
  // The first layer need not compute the gradient of its input.
  void set_needs_input_grad(bool yes) { needs_input_grad_ = yes; }

  // The returned tensors stay valid until the next forward/backward of this layer.
  virtual const Tensor& forward(Context& ctx, const Tensor& x) = 0;
  virtual const Tensor& backward(Context& ctx, const Tensor& dy) = 0;

 protected:
  DType out_dtype(const Context& ctx) const { return has_override_ ? out_override_ : ctx.compute; }
  bool needs_input_grad_ = true;

 private:
  std::string name_;
  DType out_override_ = DType::f32;
  bool has_override_ = false;
};

// y = x W^T + b, x viewed as [N, in_features] whatever its shape.
class Linear final : public Layer {
 public:
  Linear(std::string name, int64_t in, int64_t out) : Layer(std::move(name)), in_(in), out_(out) {}
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::vector<Param*> params) override;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;

 private:
  int64_t in_, out_;
  Param* weight_ = nullptr;
  Param* bias_ = nullptr;
  Tensor x_;  // the input of the last forward, viewed 2-D
  OwnedTensor y_, dx_;
};

class ReLU final : public Layer {
 public:
  using Layer::Layer;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;

 private:
  OwnedTensor y_, dx_;
};

}  // namespace ringtrain
