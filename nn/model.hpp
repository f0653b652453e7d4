// Model: a graph of layers (nodes in topological order, each reading the outputs of earlier
// nodes or the model input) over one flat parameter store (fp32 masters, compute-dtype
// working copy, compute-dtype gradients), the layout that bucketing, fused optimizers and
// checkpoints rely on. Built from a model file by build_model() (nn/graph_builder.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/layers.hpp"
#include "nn/loss.hpp"

namespace ringtrain {

// One node of a model: its layer, where its inputs come from, and the per-node options of
// the model file that concern its parameters.
struct GraphNode {
  std::unique_ptr<Layer> layer;
  std::vector<int> inputs;  // indices of earlier nodes; -1: the model input
  struct InitOverride {
    std::string param;  // empty: every parameter of the node
    Init init = Init::fan_in_uniform;
    double std = 0;
  };
  std::vector<InitOverride> init;
  // weight decay on this node's parameters; unset: each parameter's default (ParamSpec::decay)
  std::optional<bool> decay;
  std::map<std::string, std::string> shared;  // param -> the earlier "node.param" it is
  int repeat_body = -1;  // the repeat-body instance it was expanded in (-1: none)
};

// What the graph executor reports per node, passed by the loop that runs it (the trainer's
// step: diagnostics, tracing, test faults, and the gradient-ready calls through which gradient
// communication starts while backward goes on). Each member may be empty.
struct LayerHooks {
  // Before the node runs (ZeRO-1: waits for the all-gather of its parameters; ZeRO-3: gathers
  // them).
  std::function<void(size_t node)> before_forward;
  std::function<void(size_t node, const Tensor& y)> after_forward;  // the node's output
  // Before the node's backward, and before a recomputation of the segment it ends (ZeRO-2:
  // points its parameters' gradients at their bucket; ZeRO-3: gathers its parameters).
  std::function<void(size_t node)> before_backward;
  // The node's (first) input gradient, empty where none is computed; before grad_ready.
  std::function<void(size_t node, const Tensor& dx)> after_backward;
  std::function<void(size_t param)> grad_ready;  // index into Model::params(), complete
};

class Model {
 public:
  // `text`: the normalised model file the nodes were built from (what checkpoints store).
  // Without `flat_buffers` the flat masters, working copy and gradient are not allocated:
  // the caller shards them at once (ZeRO-3: shard_masters in fp16/bf16, shard_parameters,
  // release_grad), which allocate only the shard, so no rank ever holds the whole model.
  Model(std::vector<GraphNode> nodes, DType compute, std::string text = {},
        bool flat_buffers = true);
  // A chain: each layer reads the previous one's output (models built in code, tests).
  Model(std::vector<std::unique_ptr<Layer>> layers, DType compute);

  const std::string& text() const { return text_; }
  // One sample's shape and the outputs per sample, as the model file states them (set by
  // build_model; empty and 0 for a chain built in code).
  const Shape& input_shape() const { return input_; }
  int64_t classes() const { return classes_; }
  void set_io(Shape input, int64_t classes) {
    input_ = std::move(input);
    classes_ = classes;
  }
  // The loss of the model file (softmax cross-entropy for a model built in code), and one
  // sample's target shape (empty for labels).
  const LossSpec& loss() const { return loss_; }
  const Shape& target_shape() const { return target_; }
  void set_loss(LossSpec spec, Shape target) {
    loss_ = std::move(spec);
    target_ = std::move(target);
  }
  DType compute_dtype() const { return compute_; }
  int64_t num_params() const { return num_params_; }
  // The parameters in the flat buffers (a shared parameter appears once, at its owner).
  std::vector<Param>& params() { return params_; }
  // Non-trainable fp32 state (BatchNorm running averages), in one flat buffer.
  std::vector<StateBuffer>& buffers() { return buffers_; }
  int64_t num_buffer_elems() const { return num_buffer_elems_; }
  Tensor state() const {
    return Tensor(state_.data(), {num_buffer_elems_}, DType::f32, state_.device());
  }
  // Where the flat buffers live: the DeviceScope's device when the model was built.
  Device device() const { return master_.device(); }
  // The node of that name; null if none.
  Layer* find_layer(const std::string& name) const;
  std::vector<std::string> layer_names() const;  // node names, in order (for messages)
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
  const std::vector<std::vector<int>>& node_inputs() const { return inputs_; }

  // The fp32 masters: all of them, or with shard_masters() the flat range
  // [master_offset(), master_offset() + master().numel()) only.
  Tensor master() const {
    return Tensor(master_.data(), {master_count_}, DType::f32, master_.device());
  }
  int64_t master_offset() const { return master_lo_; }
  bool masters_sharded() const { return sharded_; }
  // The compute-dtype working copy (all parameters; with shard_parameters() the flat range of
  // master() only); in fp32 it is the masters.
  Tensor work() const {
    if (compute_ == DType::f32) return master();
    return Tensor(work_.data(), {params_sharded_ ? master_count_ : num_params_}, compute_,
                  work_.device());
  }
  // The working copy of the flat range the masters hold (all of it unless they are sharded).
  Tensor work_shard() const {
    return params_sharded_ ? work() : work().slice(master_lo_, {master_count_});
  }

  // ZeRO-1 in fp16/bf16: this rank keeps the fp32 masters of the flat range [lo, hi) only.
  // The layers compute with the 16-bit working copy, except for the parameters they read
  // in fp32 (ParamSpec::reads_fp32: biases, normalisation parameters; every parameter of a
  // layer computing in another dtype than the model's): those get a full-size fp32 copy in
  // one compact region, fp32_copy(), which Param::master views; the other parameters' master
  // is empty. The caller (the Trainer) fills the working copy and the region outside the
  // shard by all-gathers. Call right after construction, before init_parameters.
  void shard_masters(int64_t lo, int64_t hi);
  // ZeRO-3: this rank keeps the parameters of the flat range [lo, hi) only: its fp32 masters
  // (in fp16/bf16 call shard_masters(lo, hi) first; the full fp32 copy of the parameters read
  // in fp32 stays whole) and in fp16/bf16 its working copy, work(). Every Param::work (in fp32
  // also Param::master, a shared parameter's as well) is then empty until the caller points
  // it at gathered values for a node's use (node_bindings) and empty again afterwards. Call
  // right after construction (and shard_masters), before init_parameters.
  void shard_parameters(int64_t lo, int64_t hi);
  bool parameters_sharded() const { return params_sharded_; }
  // The parameters node `node`'s layer reads, each with the index into params() of the
  // parameter whose values it holds: itself, or the owner of one it shares.
  std::vector<std::pair<Param*, size_t>> node_bindings(size_t node);
  // The repeat-body instance (segment) node `node` belongs to; -1: none.
  int segment_of(size_t node) const { return segment_of_[node]; }
  // The region: segment i holds the flat elements [flat, flat + count) at element `at`, in
  // increasing flat order (so any contiguous flat range is one contiguous piece of it).
  struct Fp32Segment {
    int64_t flat = 0, count = 0, at = 0;
  };
  Tensor fp32_copy() const {
    return Tensor(fp32_.data(), {fp32_count_}, DType::f32, fp32_.device());
  }
  const std::vector<Fp32Segment>& fp32_segments() const { return fp32_segments_; }
  // Elements of the region whose flat index lies in [lo, hi).
  int64_t fp32_count_in(int64_t lo, int64_t hi) const;
  Tensor grad() const { return flat(grad_, compute_); }  // compute-dtype gradients
  // ZeRO-2: frees the flat gradient buffer; grad() keeps its shape and dtype but has no data,
  // and each Param::grad is empty until the caller points it at memory for a backward
  // (a shared parameter's own gradient stays as it is).
  void release_grad();

  // Draws the masters from `seed` (one stream per parameter name, so the values do not
  // depend on the node order), resets the state buffers and refreshes the working copy.
  // On the host; a model on a GPU receives the values through host staging buffers.
  void init_parameters(uint64_t seed, kernels::Backend& backend);
  // After the masters were replaced (checkpoint, broadcast): working copy = cast(masters).
  // With sharded masters only the shard's part of the working copy and of fp32_copy().
  void refresh_working_copy(kernels::Backend& backend);
  // Sharded masters: copies the shard's part of the fp32-read parameters into fp32_copy(),
  // all of it or the part in the flat range [lo, hi) only.
  void copy_shard_to_fp32(int64_t lo = 0, int64_t hi = INT64_MAX);

  // The graph executor (nn/executor.cpp). forward runs the nodes in order and returns the
  // last node's output, the logits in fp32 (the precision policy keeps the last node's
  // output in fp32). On a GPU, each node's allocations carry its name (AllocScope) for
  // out-of-memory messages. The hooks, if given, are called before each node and see its
  // output.
  const Tensor& forward(Context& ctx, const Tensor& x, const LayerHooks& hooks = {});
  // The nodes' parameter index ranges (first, count) into params(), per node.
  const std::vector<std::pair<size_t, size_t>>& layer_params() const { return layer_params_; }
  // Runs the nodes backward in reverse order, summing the gradients of outputs read by
  // several nodes, and writes every parameter gradient (compute dtype) into grad(). After
  // each node, hooks.after_backward, then hooks.grad_ready for each of its parameters.
  void backward(Context& ctx, const Tensor& dlogits, const LayerHooks& hooks = {});

  // Activation recomputation (--recompute blocks). The nodes of one repeat-body instance (a
  // transformer block), a contiguous run in node order, form a segment. Forward copies the
  // outputs of a segment that later nodes read into buffers of the executor and moves its
  // layers' buffers (Layer::activation_buffers) to the next segment's layers; the last keeps
  // them. Backward moves them back one segment at a time, once the gradients a segment passes
  // to earlier nodes are copied out, and runs the segment's forward again in them
  // (Context::recomputing; the same dropout masks, which depend on the step's seed and node
  // name only; no hooks) before its backward. One segment's activations are held at a time,
  // allocated once; bitwise the results without it wherever the kernels are deterministic.
  size_t recompute_segments() const { return segments_.size(); }
  void set_recompute(bool on) { recompute_ = on; }
  bool recompute() const { return recompute_; }
  // The bytes the layers' buffers (Layer::activation_buffers) and the executor's hold now,
  // and the most of them seen since reset_activation_peak() (forward and backward note them
  // where they peak: before each segment's buffers move on, and after backward).
  size_t activation_bytes();
  size_t activation_peak() const { return activation_peak_; }
  void reset_activation_peak() { activation_peak_ = 0; }

 private:
  Tensor flat(const Buffer& b, DType t) const {
    return Tensor(b.data(), {num_params_}, t, b.device());
  }
  void apply_policy();
  void init_sharded(uint64_t seed, kernels::Backend& backend);
  void find_segments(const std::vector<int>& repeat_body);
  void note_activation_peak() { activation_peak_ = std::max(activation_peak_, activation_bytes()); }
  // Recomputation: saves segment s's outputs read after it and releases its buffers to s + 1
  // (forward); runs its forward again (backward); copies the gradients it passed to earlier
  // nodes out of its buffers and releases them to s - 1 (after its backward).
  void save_and_release(Context& ctx, size_t s);
  void recompute_segment(Context& ctx, size_t s);
  void move_grads_and_release(Context& ctx, size_t s);

  std::string text_;
  Shape input_;
  int64_t classes_ = 0;
  LossSpec loss_{{LossTerm{}}, {}};
  Shape target_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::vector<int>> inputs_;
  DType compute_;
  int64_t num_params_ = 0;
  std::vector<Param> params_;
  std::vector<std::pair<size_t, size_t>> layer_params_;  // per node: first param, count
  // A parameter a node shares with an earlier one: the owner's values, its own gradient,
  // added into the owner's when the owner's backward is done.
  struct Shared {
    size_t owner;  // index into params_
    size_t node;   // the sharing node
    Param param;
    OwnedTensor grad;
  };
  std::vector<std::unique_ptr<Shared>> shared_;
  std::vector<StateBuffer> buffers_;
  int64_t num_buffer_elems_ = 0;
  Buffer master_, work_, grad_, state_;
  int64_t master_lo_ = 0, master_count_ = 0;
  bool sharded_ = false, params_sharded_ = false;
  // Per node, the parameters its layer binds: (shared, index into shared_ or params_).
  std::vector<std::vector<std::pair<bool, size_t>>> binds_;
  Buffer fp32_;  // sharded masters: the full fp32 copy of the parameters read in fp32
  int64_t fp32_count_ = 0;
  std::vector<Fp32Segment> fp32_segments_;
  // Executor state: each node's output, and its gradient as it is summed.
  std::vector<const Tensor*> outs_;
  std::vector<Tensor> grads_;
  std::vector<char> has_grad_;
  std::vector<OwnedTensor> grad_sums_;
  std::vector<Tensor> dxs_;
  // Recomputation: the segments [begin, end) in node order; per node, whether its output is
  // read after its segment (or is the model's output); the last forward's input and whether
  // it moved the segments' buffers; the saved outputs and the gradients copied out, per node.
  struct Segment {
    size_t begin = 0, end = 0;
  };
  std::vector<Segment> segments_;
  std::vector<int> segment_of_;  // per node: its segment, -1 for none
  std::vector<char> read_after_;
  bool recompute_ = false, released_ = false;
  Tensor forward_input_;
  std::vector<OwnedTensor> saved_, moved_grads_;
  size_t activation_peak_ = 0;
};

}  // namespace ringtrain
