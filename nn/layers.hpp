// Layer: the unit a graph node runs, and the layers the shipped ops are made of: Linear,
// Conv2D (each with a fused activation), ReLU, GELU, MaxPool2D, GlobalAvgPool, Flatten,
// Reshape, Dropout, BatchNorm2D, and the multi-input Add and Concat. Their forward and
// backward live in nn/ops/<family>.cpp beside the op's registration. A layer owns its
// activations; its parameters and gradients are views into the Model's
// flat buffers (fp32 masters, compute-dtype working copy, compute-dtype gradients), its
// non-trainable state (BatchNorm's running averages) views into the Model's fp32 buffers.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain {

// What a step runs with: the backend, the precision policy, and what makes this step's
// dropout masks (a counter-based stream per rank, step and layer: no state to save).
struct Context {
  kernels::Backend& backend;
  DType compute = DType::f32;  // working weights, activations, gradients
  bool training = true;
  uint64_t dropout_seed = 0;  // mix of --seed, rank and step; layers mix in their name
  // The forward being run again in backward (activation recomputation): the same outputs,
  // and no state updated a second time (BatchNorm's running averages).
  bool recomputing = false;
};

// How a parameter's initial values are drawn (model files' `init`, docs/models.md).
enum class Init {
  fan_in_uniform,   // U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (PyTorch's Linear and Conv default)
  kaiming_uniform,  // U(-sqrt(6/fan_in), sqrt(6/fan_in))
  kaiming_normal,   // N(0, 2/fan_in)
  xavier_uniform,   // U(-sqrt(6/(fan_in+fan_out)), ...)
  xavier_normal,    // N(0, 2/(fan_in+fan_out))
  normal,           // N(0, std^2)
  zeros,
  ones,
};

// How a parameter of a tensor-parallel layer (nn/tensor_parallel.hpp) is this rank's part of
// the whole tensor: along `axis`, the whole holds `groups` equal blocks (q, k and v of a
// fused projection: 3), each cut into `parts` equal pieces; this rank's part is piece `part`
// of every block, the blocks in order. axis -1: the parameter is whole (replicated).
struct TensorSplit {
  int axis = -1;
  int64_t groups = 1;
  int part = 0, parts = 1;
  Shape full;  // the whole tensor's shape (axis >= 0)
  bool split() const { return axis >= 0; }
  // [begin, end) along `axis` of the whole tensor, whose concatenation is this part.
  std::vector<std::pair<int64_t, int64_t>> ranges() const {
    std::vector<std::pair<int64_t, int64_t>> r;
    if (!split()) return r;
    const int64_t block = full[size_t(axis)] / groups, piece = block / parts;
    for (int64_t g = 0; g < groups; ++g)
      r.push_back({g * block + part * piece, g * block + (part + 1) * piece});
    return r;
  }
};

struct ParamSpec {
  std::string name;  // within the layer: "weight", "bias"
  Shape shape;
  int64_t fan_in = 1;
  Init init = Init::fan_in_uniform;
  int64_t fan_out = 1;
  double std = 0;  // Init::normal
  // Whether weight decay applies by default: the op says so for each parameter (off for
  // biases and normalisation parameters, the usual decay groups); a model file's
  // `weight_decay` and --decay-all override it.
  bool decay = true;
  // The layer reads this parameter from the fp32 masters whatever the compute dtype (biases
  // and normalisation parameters): ZeRO-1 in fp16/bf16 keeps a full fp32 copy of these only.
  bool reads_fp32 = false;
};

struct Param {
  std::string name;  // "<layer>.<param>", the checkpoint name
  Shape shape;
  int64_t offset = 0;               // in elements, into the flat buffers
  int64_t fan_in = 1, fan_out = 1;  // for the initialisation
  Init init = Init::fan_in_uniform;
  double std = 0;
  bool decay = true;        // weight decay applies (ParamSpec::decay unless the model file says)
  bool reads_fp32 = false;  // ParamSpec::reads_fp32
  TensorSplit split;        // Layer::param_split
  // fp32: the whole parameter; with sharded masters (Model::shard_masters) a full-size copy
  // for parameters read in fp32 and empty for the others.
  Tensor master;
  Tensor work;  // compute dtype (aliases master in fp32)
  Tensor grad;  // compute dtype
};

// Non-trainable fp32 state saved in checkpoints as /buffers/<layer>.<name>.
struct StateBuffer {
  std::string name;
  Shape shape;
  int64_t offset = 0;
  Init init = Init::zeros;
  Tensor value;  // fp32
};

// dy masked by the fused ReLU of a layer whose output was y; `scratch` holds the result.
Tensor relu_masked(Context& ctx, kernels::Activation act, const Tensor& y, const Tensor& dy,
                   OwnedTensor& scratch);

// The ranks a tensor-parallel layer is split across (nn/tensor_parallel.hpp): this rank's
// place, and the in-place sum of a tensor over the group (a collective every member calls).
struct TensorParallelGroup {
  int rank = 0, size = 1;
  std::function<void(const Tensor&)> allreduce_sum;
};
// How a layer is split (Megatron-LM): `column` keeps 1/T of the outputs (its input gradient
// summed over the group), `row` 1/T of the inputs (its output summed over the group, the
// bias added once), `heads` 1/T of the attention heads.
enum class TensorSplitRole { column, row, heads };

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  const std::string& name() const { return name_; }
  virtual std::vector<ParamSpec> param_specs() const { return {}; }
  virtual std::vector<ParamSpec> buffer_specs() const { return {}; }
  // Called once the Model has laid out the flat buffers; in param_specs()/buffer_specs() order.
  virtual void bind(std::vector<Param*> params) {}
  virtual void bind_buffers(std::vector<StateBuffer*> buffers) {}
  // Before the Model lays out the parameters: keep this rank's part of the layer (`groups`:
  // equal blocks of the outputs, each split separately, for `column`). `group` outlives the
  // layer. Returns "" when done, else why this layer cannot be split so.
  virtual std::string split_tensor_parallel(TensorSplitRole /*role*/, int64_t /*groups*/,
                                            const TensorParallelGroup* /*group*/) {
    return "its op has no tensor-parallel form";
  }
  // How the parameter `name` (a ParamSpec's) is this rank's part of the whole tensor after
  // split_tensor_parallel; whole by default.
  virtual TensorSplit param_split(const std::string& /*name*/) const { return {}; }

  // Output dtype override (the precision policy keeps the last layer's output in fp32).
  void set_output_dtype(DType t) {
    out_override_ = t;
    has_out_override_ = true;
  }
  // Per-layer precision override: this layer computes (weights, activations, gradients)
  // in `t` whatever the model's compute dtype; inputs and gradients are cast at its edges.
  virtual void set_dtype(DType t) {
    dtype_ = t;
    has_dtype_ = true;
  }
  bool has_dtype_override() const { return has_dtype_; }
  // The dtype this layer computes in under `ctx` (its override, else the compute dtype).
  DType compute_dtype(const Context& ctx) const { return dtype(ctx); }
  // The first layer need not compute the gradient of its input.
  virtual void set_needs_input_grad(bool yes) { needs_input_grad_ = yes; }

  // The returned tensors stay valid until the next forward/backward of this layer.
  virtual const Tensor& forward(Context& ctx, const Tensor& x) = 0;
  virtual const Tensor& backward(Context& ctx, const Tensor& dy) = 0;
  // Layers of several inputs (Add, Concat) override these; a one-input layer is called
  // through forward()/backward(). backward_inputs() writes one gradient per input (an
  // empty tensor where none is needed), each valid until this layer's next backward.
  virtual const Tensor& forward_inputs(Context& ctx, const std::vector<const Tensor*>& xs) {
    return forward(ctx, *xs[0]);
  }
  virtual void backward_inputs(Context& ctx, const Tensor& dy, std::vector<Tensor>& dxs) {
    dxs.assign(1, backward(ctx, dy));
  }

  // Fusion with the neighbours, the op's own hook (Model::apply_policy calls it once, when
  // `reader` is the only layer reading this layer's output): a producer may hand work to its
  // reader, asking what the reader can take. Conv2D hands its ReLU's gradient mask and its
  // blocked output layout to a Conv2D or MaxPool2D.
  virtual void fuse_with_reader(Layer& reader) {}
  // What a reader can take over (true: it now does): applying the producer's ReLU gradient
  // (its input is a ReLU's output), reading its input in the backend's activation layout.
  virtual bool take_relu_input() { return false; }
  virtual bool take_blocked_input() { return false; }

  // The buffers this layer owns for one step: its output, what forward keeps for backward,
  // casts, backward's scratch, each rebuilt by the next forward or backward (none holds what
  // a later step reads). Activation recomputation (Model::set_recompute) moves them to the
  // same layer of the next repeat body, frees them, and counts them. A layer listing none (a
  // plugin's, by default) keeps its memory and is still recomputed correctly.
  virtual std::vector<OwnedTensor*> activation_buffers() { return {}; }
  size_t activation_bytes();
  void release_activations();

 protected:
  DType dtype(const Context& ctx) const { return has_dtype_ ? dtype_ : ctx.compute; }
  DType out_dtype(const Context& ctx) const {
    return has_out_override_ ? out_override_ : dtype(ctx);
  }
  // `t` in this layer's dtype: t itself, or a converted copy held in `scratch`.
  const Tensor& in_dtype(Context& ctx, const Tensor& t, OwnedTensor& scratch) const;
  // The weights this layer computes with: the working copy, the fp32 masters when the layer
  // is kept in fp32, or a converted copy in `scratch` for another override.
  Tensor weights(Context& ctx, const Param& p, OwnedTensor& scratch) const;
  // Where this layer writes a parameter's gradient: the flat gradient itself when the dtypes
  // agree, else `scratch`, which commit_grad() then converts into the flat gradient.
  Tensor grad_target(Context& ctx, const Param& p, OwnedTensor& scratch) const;
  void commit_grad(Context& ctx, const Param& p, const Tensor& target) const;

  bool needs_input_grad_ = true;

 private:
  std::string name_;
  DType out_override_ = DType::f32, dtype_ = DType::f32;
  bool has_out_override_ = false, has_dtype_ = false;
};

// y = act(x W^T + b), x viewed as [N, in_features] whatever its shape; with last_axis, x is
// [..., in_features] and y keeps the leading dimensions ([B, T, C] -> [B, T, out]).
class Linear final : public Layer {
 public:
  Linear(std::string name, int64_t in, int64_t out,
         kernels::Activation act = kernels::Activation::none, bool bias = true,
         bool last_axis = false)
      : Layer(std::move(name)),
        in_(in),
        out_(out),
        act_(act),
        has_bias_(bias),
        last_axis_(last_axis) {}
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::vector<Param*> params) override;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override {
    return {&xin_, &weight_cast_, &y_, &dy_masked_, &dx_, &dw_};
  }
  // column: out_features / T (its input gradient summed over the group); row: in_features
  // / T (its output summed over the group, the bias added by the group's rank 0).
  std::string split_tensor_parallel(TensorSplitRole role, int64_t groups,
                                    const TensorParallelGroup* group) override;
  TensorSplit param_split(const std::string& name) const override {
    return name == "weight" ? weight_split_ : bias_split_;
  }

 private:
  int64_t in_, out_;
  kernels::Activation act_;
  bool has_bias_, last_axis_;
  int64_t fan_in_ = 0;  // the whole layer's in_features (0: in_), for the initialisation
  const TensorParallelGroup* tp_ = nullptr;
  TensorSplitRole tp_role_ = TensorSplitRole::column;
  TensorSplit weight_split_, bias_split_;
  Param* weight_ = nullptr;
  Param* bias_ = nullptr;
  Tensor x_;  // the input of the last forward, viewed 2-D, in this layer's dtype
  Shape x_shape_;
  // weight_cast_: the weight in this layer's dtype; dy_masked_: dy through the ReLU's mask.
  OwnedTensor xin_, weight_cast_, y_, dy_masked_, dx_, dw_;
};

// y = act(conv(x, W) + b) on [N, C, H, W]; square kernel, one stride and padding.
class Conv2D final : public Layer {
 public:
  struct Options {
    int64_t in_channels = 1, out_channels = 1, kernel = 3, stride = 1, padding = 0;
    bool bias = true;
    kernels::Activation act = kernels::Activation::none;
  };
  Conv2D(std::string name, Options o) : Layer(std::move(name)), o_(o) {}
  // The next layer applies this layer's ReLU gradient (a MaxPool2D or Conv2D with
  // set_relu_input).
  void set_relu_grad_done_by_next(bool yes) { relu_grad_by_next_ = yes; }
  // Input / output (and their gradients) in the backend's activation_layout() (kernels::Layout,
  // channels innermost; NCHW on a backend without one): set by Model::apply_policy for
  // tensors that pass only between convolutions and max pooling.
  void set_input_blocked(bool yes) { x_blocked_ = yes; }
  void set_output_blocked(bool yes) { y_blocked_ = yes; }
  // The input is the output of a previous layer's fused ReLU, whose gradient this layer
  // applies to its dx in place (one pass over the tensor fewer); that layer then skips its
  // own ReLU mask.
  void set_relu_input(bool yes) { relu_input_ = yes; }
  kernels::Activation activation() const { return o_.act; }
  void fuse_with_reader(Layer& reader) override;
  bool take_relu_input() override { return relu_input_ = true; }
  bool take_blocked_input() override { return x_blocked_ = true; }
  int64_t out_channels() const { return o_.out_channels; }
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::vector<Param*> params) override;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override {
    return {&xin_, &weight_cast_, &y_, &dy_masked_, &dx_, &dw_};
  }

 private:
  Options o_;
  bool relu_grad_by_next_ = false, relu_input_ = false, x_blocked_ = false, y_blocked_ = false;
  kernels::ConvShape cs_;
  Param* weight_ = nullptr;
  Param* bias_ = nullptr;
  Tensor x_;
  // weight_cast_: the weight in this layer's dtype; dy_masked_: dy through the ReLU's mask.
  OwnedTensor xin_, weight_cast_, y_, dy_masked_, dx_, dw_;
};

class ReLU final : public Layer {
 public:
  using Layer::Layer;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override { return {&xin_, &y_, &dx_}; }

 private:
  OwnedTensor xin_, y_, dx_;
};

// The exact (erf) GELU.
class GELU final : public Layer {
 public:
  using Layer::Layer;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override { return {&xin_, &y_, &dx_}; }

 private:
  Tensor x_;
  OwnedTensor xin_, y_, dx_;
};

// y = f(x) for a pointwise kernel of the backend's kernel table (kernels::Backend::unary):
// the layer of every table activation (SiLU, ...); x is kept for the backward pass.
class Pointwise final : public Layer {
 public:
  Pointwise(std::string name, std::string kernel)
      : Layer(std::move(name)), kernel_(std::move(kernel)) {}
  const std::string& kernel() const { return kernel_; }
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override { return {&xin_, &y_, &dx_}; }

 private:
  std::string kernel_;
  Tensor x_;
  OwnedTensor xin_, y_, dx_;
};

class MaxPool2D final : public Layer {
 public:
  MaxPool2D(std::string name, int64_t kernel, int64_t stride)
      : Layer(std::move(name)), kernel_(kernel), stride_(stride) {}
  // The input is the output of a layer's fused ReLU, whose gradient this pooling applies
  // (kernels::PoolShape::relu_input); that layer then skips its own ReLU mask.
  void set_relu_input(bool yes) { relu_input_ = yes; }
  // The input (and its gradient) in the backend's activation_layout(), as Conv2D's.
  void set_input_blocked(bool yes) { x_blocked_ = yes; }
  bool take_relu_input() override { return relu_input_ = true; }
  bool take_blocked_input() override { return x_blocked_ = true; }
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override {
    return {&xin_, &y_, &argmax_, &dy_cast_, &dx_};
  }

 private:
  int64_t kernel_, stride_;
  bool relu_input_ = false, x_blocked_ = false;
  kernels::PoolShape ps_;
  Shape x_shape_;
  OwnedTensor xin_, y_, argmax_, dy_cast_, dx_;  // dy_cast_: dy in the input's dtype
};

// [N, C, H, W] -> [N, C], the mean over H and W.
class GlobalAvgPool final : public Layer {
 public:
  using Layer::Layer;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override { return {&y_, &dx_}; }

 private:
  Shape x_shape_;
  OwnedTensor y_, dx_;
};

// [N, ...] -> [N, prod(...)]: a view, no copy.
class Flatten final : public Layer {
 public:
  using Layer::Layer;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;

 private:
  Shape x_shape_;
  Tensor y_, dx_;
};

// Inverted dropout: in training, each element is zeroed with probability p and the others
// scaled by 1/(1-p); identity in evaluation. The mask of element i at a step is a pure
// function of (--seed, rank, step, layer name, i), so a resumed run is bitwise identical.
class Dropout final : public Layer {
 public:
  Dropout(std::string name, float p) : Layer(std::move(name)), p_(p) {}
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override { return {&y_, &mask_, &dx_}; }

 private:
  float p_;
  bool dropped_ = false;  // the last forward applied a mask
  Tensor pass_;
  OwnedTensor y_, mask_, dx_;
};

// Batch normalisation over N, H, W per channel. The statistics, the affine parameters
// (weight = gamma, bias = beta) and the running averages are always fp32, whatever the
// compute dtype; the input and output are in the layer's dtype.
class BatchNorm2D final : public Layer {
 public:
  BatchNorm2D(std::string name, int64_t channels, kernels::BatchNormConfig cfg = {})
      : Layer(std::move(name)), c_(channels), cfg_(cfg) {}
  std::vector<ParamSpec> param_specs() const override;
  std::vector<ParamSpec> buffer_specs() const override;
  void bind(std::vector<Param*> params) override;
  void bind_buffers(std::vector<StateBuffer*> buffers) override;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override {
    return {&xin_, &y_, &mean_, &invstd_, &dx_, &dgamma_, &dbeta_, &running_copy_};
  }

 private:
  int64_t c_;
  kernels::BatchNormConfig cfg_;
  Param* gamma_ = nullptr;
  Param* beta_ = nullptr;
  StateBuffer* running_mean_ = nullptr;
  StateBuffer* running_var_ = nullptr;
  bool training_ = true;
  Tensor x_;
  OwnedTensor xin_, y_, mean_, invstd_, dx_, dgamma_, dbeta_;
  OwnedTensor running_copy_;  // recomputation: the running averages' scratch, left as they are
};

// y = x0 + x1 + ... (one shape); each input's gradient is dy itself.
class Add final : public Layer {
 public:
  using Layer::Layer;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override { return {&y_, &acc_}; }
  const Tensor& forward_inputs(Context& ctx, const std::vector<const Tensor*>& xs) override;
  void backward_inputs(Context& ctx, const Tensor& dy, std::vector<Tensor>& dxs) override;

 private:
  size_t inputs_ = 0;
  OwnedTensor y_, acc_;
};

// Joins [N, C_i, ...] inputs along dimension 1 into [N, sum C_i, ...].
class Concat final : public Layer {
 public:
  using Layer::Layer;
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;
  std::vector<OwnedTensor*> activation_buffers() override;
  const Tensor& forward_inputs(Context& ctx, const std::vector<const Tensor*>& xs) override;
  void backward_inputs(Context& ctx, const Tensor& dy, std::vector<Tensor>& dxs) override;

 private:
  std::vector<Shape> shapes_;
  OwnedTensor y_;
  std::vector<OwnedTensor> dx_;
};

// [N, ...] -> [N, shape...]: a view, no copy.
class Reshape final : public Layer {
 public:
  Reshape(std::string name, Shape shape) : Layer(std::move(name)), shape_(std::move(shape)) {}
  const Tensor& forward(Context& ctx, const Tensor& x) override;
  const Tensor& backward(Context& ctx, const Tensor& dy) override;

 private:
  Shape shape_, x_shape_;
  Tensor y_, dx_;
};

}  // namespace ringtrain
