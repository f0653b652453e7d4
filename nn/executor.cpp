// The graph executor: Model::forward runs the nodes in topological order, Model::backward
// in reverse, summing the gradients of outputs that several nodes read and firing the
// gradient-ready hook per node (so the GradReducer's buckets overlap with backward), and
// with activation recomputation passes one set of activation buffers from repeat body to
// repeat body, running a body's forward again before its backward.
#include <optional>

#include "core/error.hpp"
#include "nn/model.hpp"

namespace ringtrain {

const Tensor& Model::forward(Context& ctx, const Tensor& x, const LayerHooks& hooks) {
  RT_CHECK(!layers_.empty(), "a model without nodes");
  MemoryScope in(MemCategory::activations);  // but what layers charge elsewhere (layer.cpp)
  outs_.assign(layers_.size(), nullptr);
  const bool label = master_.device().kind != Device::cpu;  // out-of-memory messages
  released_ = recompute_ && segments_.size() > 1;
  forward_input_ = x;
  std::vector<const Tensor*> xs;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (hooks.before_forward) hooks.before_forward(l);
    xs.clear();
    for (int in : inputs_[l]) xs.push_back(in < 0 ? &x : outs_[size_t(in)]);
    {
      std::optional<AllocScope> scope;
      if (label) scope.emplace(layers_[l]->name());
      outs_[l] = &layers_[l]->forward_inputs(ctx, xs);
    }
    if (hooks.after_forward) hooks.after_forward(l, *outs_[l]);
    const int s = segment_of_[l];
    // Every segment but the last, whose activations backward uses first, hands its buffers
    // to the next once its outputs read later are saved.
    if (released_ && s >= 0 && l + 1 == segments_[size_t(s)].end &&
        size_t(s) + 1 < segments_.size()) {
      save_and_release(ctx, size_t(s));
    }
  }
  return *outs_.back();
}

namespace {

// Moves the buffers of `from`'s layers to the layers of `to`, pairwise in node order (the
// bodies of one repeat have the same nodes, so each buffer fits where it goes and is not
// allocated again); what a receiver held, and what finds no receiver, is freed.
void move_buffers(const std::vector<std::unique_ptr<Layer>>& layers, size_t from_begin,
                  size_t from_end, size_t to_begin, size_t to_end) {
  for (size_t k = 0; k < from_end - from_begin; ++k) {
    Layer& src = *layers[from_begin + k];
    if (to_begin + k >= to_end) {
      src.release_activations();
      continue;
    }
    const std::vector<OwnedTensor*> mine = src.activation_buffers();
    const std::vector<OwnedTensor*> theirs = layers[to_begin + k]->activation_buffers();
    for (size_t i = 0; i < mine.size(); ++i) {
      if (i < theirs.size()) *theirs[i] = std::move(*mine[i]);
      *mine[i] = OwnedTensor{};
    }
  }
}

}  // namespace

void Model::save_and_release(Context& ctx, size_t s) {
  const Segment &seg = segments_[s], &next = segments_[s + 1];
  for (size_t l = seg.begin; l < seg.end; ++l) {
    if (!read_after_[l]) continue;
    Tensor& copy = saved_[l].ensure(outs_[l]->shape, outs_[l]->dtype, outs_[l]->device);
    ctx.backend.cast(*outs_[l], copy);  // same dtype: a copy, in stream order on a GPU
    outs_[l] = &saved_[l].view;
  }
  note_activation_peak();
  move_buffers(layers_, seg.begin, seg.end, next.begin, next.end);
}

void Model::recompute_segment(Context& ctx, size_t s) {
  const Segment& seg = segments_[s];
  const bool label = master_.device().kind != Device::cpu;
  const bool was = ctx.recomputing;
  ctx.recomputing = true;
  std::vector<const Tensor*> xs;
  for (size_t l = seg.begin; l < seg.end; ++l) {
    xs.clear();
    for (int in : inputs_[l]) xs.push_back(in < 0 ? &forward_input_ : outs_[size_t(in)]);
    std::optional<AllocScope> scope;
    if (label) scope.emplace(layers_[l]->name());
    outs_[l] = &layers_[l]->forward_inputs(ctx, xs);
  }
  ctx.recomputing = was;
}

void Model::move_grads_and_release(Context& ctx, size_t s) {
  // The gradients of earlier nodes' outputs may be views of this segment's buffers (a
  // layer's dx, an Add's dy passed on), which the segment before is about to overwrite.
  const Segment &seg = segments_[s], &prev = segments_[s - 1];
  for (size_t src = 0; src < seg.begin; ++src) {
    if (!has_grad_[src]) continue;
    const void* at = grads_[src].data;
    if (at == grad_sums_[src].view.data || at == moved_grads_[src].view.data) continue;
    Tensor& copy =
        moved_grads_[src].ensure(grads_[src].shape, grads_[src].dtype, grads_[src].device);
    ctx.backend.cast(grads_[src], copy);
    grads_[src] = copy;
  }
  note_activation_peak();
  move_buffers(layers_, seg.begin, seg.end, prev.begin, prev.end);
  for (size_t l = seg.begin; l < seg.end; ++l)
    if (read_after_[l]) outs_[l] = &saved_[l].view;
}

void Model::backward(Context& ctx, const Tensor& dlogits, const LayerHooks& hooks) {
  const size_t n = layers_.size();
  MemoryScope in(MemCategory::activations);
  grads_.assign(n, Tensor());
  has_grad_.assign(n, 0);
  grad_sums_.resize(n);
  grads_[n - 1] = dlogits;
  has_grad_[n - 1] = 1;
  const bool label = master_.device().kind != Device::cpu;
  for (size_t l = n; l-- > 0;) {
    RT_CHECK(has_grad_[l], "node ", layers_[l]->name(), " got no gradient");
    const int s = released_ ? segment_of_[l] : -1;
    // Before the recomputation too: the hook may provide the segment's parameters (ZeRO-3).
    if (hooks.before_backward) hooks.before_backward(l);
    if (s >= 0 && l + 1 == segments_[size_t(s)].end && size_t(s) + 1 < segments_.size())
      recompute_segment(ctx, size_t(s));  // in the buffers the segment after it handed over
    {
      std::optional<AllocScope> scope;
      if (label) scope.emplace(layers_[l]->name());
      layers_[l]->backward_inputs(ctx, grads_[l], dxs_);
    }
    if (hooks.after_backward) hooks.after_backward(l, dxs_.empty() ? Tensor() : dxs_[0]);
    for (size_t j = 0; j < inputs_[l].size(); ++j) {
      const int in = inputs_[l][j];
      if (in < 0) continue;
      const auto src = size_t(in);
      if (!has_grad_[src]) {  // the first reader's gradient, used as it is
        grads_[src] = dxs_[j];
        has_grad_[src] = 1;
        continue;
      }
      // Another reader: the sum, in the dtype of the node that produced the output.
      Tensor& sum = grad_sums_[src].ensure(grads_[src].shape, layers_[src]->compute_dtype(ctx));
      ctx.backend.add(grads_[src], dxs_[j], sum);
      grads_[src] = sum;
    }
    // A parameter shared with a later node: add that node's gradient (computed earlier in
    // this backward pass) before the parameter is reported ready.
    const auto [first, count] = layer_params_[l];
    for (auto& s : shared_)
      if (s->owner >= first && s->owner < first + count)
        ctx.backend.add(params_[s->owner].grad, s->param.grad, params_[s->owner].grad);
    if (s > 0 && l == segments_[size_t(s)].begin)  // the first keeps its buffers
      move_grads_and_release(ctx, size_t(s));
    if (!hooks.grad_ready) continue;
    for (size_t i = first; i < first + count; ++i) hooks.grad_ready(i);
  }
  note_activation_peak();
}

}  // namespace ringtrain
