// The graph executor: Model::forward runs the nodes in topological order, Model::backward
// in reverse, summing the gradients of outputs that several nodes read and firing the
// gradient-ready hook per node (so the GradReducer's buckets overlap with backward).
#include <optional>

#include "core/error.hpp"
#include "nn/model.hpp"

namespace ringtrain {

const Tensor& Model::forward(Context& ctx, const Tensor& x, const LayerHooks& hooks) {
  RT_CHECK(!layers_.empty(), "a model without nodes");
  MemoryScope in(MemCategory::activations);  // but what layers charge elsewhere (layer.cpp)
  outs_.assign(layers_.size(), nullptr);
  const bool label = master_.device().kind != Device::cpu;  // out-of-memory messages
  std::vector<const Tensor*> xs;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (hooks.before_forward) hooks.before_forward(l);
    xs.clear();
    for (int in : inputs_[l]) xs.push_back(in < 0 ? &x : outs_[size_t(in)]);
    std::optional<AllocScope> scope;
    if (label) scope.emplace(layers_[l]->name());
    outs_[l] = &layers_[l]->forward_inputs(ctx, xs);
    if (hooks.after_forward) hooks.after_forward(l, *outs_[l]);
  }
  return *outs_.back();
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
    if (!hooks.grad_ready) continue;
    for (size_t i = first; i < first + count; ++i) hooks.grad_ready(i);
  }
}

}  // namespace ringtrain
