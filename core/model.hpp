// ModelSpec (a model's name and options, stored in checkpoints as JSON) and Model: a
// sequence of layers over one flat parameter store (fp32 masters, compute-dtype working
// copy, compute-dtype gradients), the layout that bucketing, fused optimizers and
// checkpoints rely on.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/layers.hpp"

namespace ringtrain {

// The models build_model() knows:
//   mlp     Linear+ReLU per `hidden` width, then Linear to `classes`
//   cnn     conv 32 3x3 + ReLU, conv 64 3x3 + ReLU, max pool 2, dropout, dense 128 + ReLU,
//           dense `classes` (input [C, H, W])
//   resnet  a CIFAR-style ResNet: 3x3 stem conv of `width` channels + BN + activation, three
//           stages of `depth` basic blocks each (widths W, 2W, 4W; stride 2 into stages 2
//           and 3, with a 1x1 conv + BN shortcut), global average pool, dense `classes`
// `layer_precision` ("conv1=fp32,fc2=bf16") overrides the compute dtype of named layers.
struct ModelSpec {
  std::string name = "mlp";
  Shape input;                  // one sample, e.g. [1, 28, 28] or [784]
  std::vector<int64_t> hidden;  // mlp: hidden layer widths
  int64_t classes = 10;
  double dropout = 0.25;            // cnn
  int64_t depth = 1, width = 16;    // resnet: blocks per stage, channels of the first stage
  std::string activation = "relu";  // resnet: relu or gelu
  std::string layer_precision;      // per-layer dtype overrides, empty for none

  std::string to_json() const;                          // canonical: equal specs give equal strings
  static ModelSpec from_json(const std::string& json);  // input error when malformed
};

class Model {
 public:
  Model(ModelSpec spec, std::vector<std::unique_ptr<Layer>> layers, DType compute);

  const ModelSpec& spec() const { return spec_; }
  DType compute_dtype() const { return compute_; }
  int64_t num_params() const { return num_params_; }
  std::vector<Param>& params() { return params_; }
  // Non-trainable fp32 state (BatchNorm running averages), in one flat buffer.
  std::vector<StateBuffer>& buffers() { return buffers_; }
  int64_t num_buffer_elems() const { return num_buffer_elems_; }
  Tensor state() const {
    return Tensor(state_.data(), {num_buffer_elems_}, DType::f32, state_.device());
  }
  // Where the flat buffers live: the DeviceScope's device when the model was built.
  Device device() const { return master_.device(); }
  // The layer of that name, searching inside blocks too ("stage1.block1.conv1"); null if none.
  Layer* find_layer(const std::string& name) const;
  // Every layer name, blocks' inner layers included (for messages).
  std::vector<std::string> layer_names() const;
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

  Tensor master() const { return flat(master_, DType::f32); }  // fp32 masters
  // The compute-dtype working copy; in fp32 it is the masters themselves.
  Tensor work() const { return compute_ == DType::f32 ? master() : flat(work_, compute_); }
  Tensor grad() const { return flat(grad_, compute_); }  // compute-dtype gradients

  // Draws the masters from `seed` (one stream per parameter name, so the values do not
  // depend on the layer order), resets the state buffers and refreshes the working copy.
  // On the host; a model on a GPU receives the values through host staging buffers.
  void init_parameters(uint64_t seed, kernels::Backend& backend);
  // After the masters were replaced (checkpoint, broadcast): working copy = cast(masters).
  void refresh_working_copy(kernels::Backend& backend);

  // Logits in fp32 (the precision policy keeps the last layer's output in fp32).
  // after_layer(l, y), if given, sees each layer's output (diagnostics, tracing). On a GPU,
  // each layer's allocations carry its name (AllocScope) for out-of-memory messages.
  const Tensor& forward(Context& ctx, const Tensor& x,
                        const std::function<void(size_t, const Tensor&)>& after_layer = {});
  // Called after each layer's backward with the layer index and its input gradient
  // (empty for the first layer), before grad_ready for its parameters.
  using BackwardHook = std::function<void(size_t, const Tensor&)>;
  void set_backward_hook(BackwardHook hook) { backward_hook_ = std::move(hook); }
  // The layers' parameter index ranges (first, count), per layer.
  const std::vector<std::pair<size_t, size_t>>& layer_params() const { return layer_params_; }
  // Writes every parameter gradient (compute dtype) into grad(). After each layer,
  // grad_ready(i) is called for each of its parameters (index into params()): the hook
  // through which gradient communication starts while backward goes on.
  void backward(Context& ctx, const Tensor& dlogits,
                const std::function<void(size_t)>& grad_ready = {});

 private:
  Tensor flat(const Buffer& b, DType t) const {
    return Tensor(b.data(), {num_params_}, t, b.device());
  }

  ModelSpec spec_;
  std::vector<std::unique_ptr<Layer>> layers_;
  DType compute_;
  int64_t num_params_ = 0;
  std::vector<Param> params_;
  std::vector<std::pair<size_t, size_t>> layer_params_;  // per layer: first param, count
  std::vector<StateBuffer> buffers_;
  int64_t num_buffer_elems_ = 0;
  BackwardHook backward_hook_;
  Buffer master_, work_, grad_, state_;
};

// Builds the model a spec names; input error for an unknown name or bad options.
std::unique_ptr<Model> build_model(const ModelSpec& spec, DType compute);

}  // namespace ringtrain
