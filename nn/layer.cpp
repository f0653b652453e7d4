// Layer's precision edges (casts where a layer's dtype differs from its neighbours') and
// the fused-ReLU gradient mask shared by Linear and Conv2D.
#include "core/error.hpp"
#include "nn/layers.hpp"

namespace ringtrain {

using kernels::Activation;

// ---- Layer: the edges of a layer whose dtype differs from its neighbours' -------------

const Tensor& Layer::in_dtype(Context& ctx, const Tensor& t, OwnedTensor& scratch) const {
  const DType d = dtype(ctx);
  if (t.dtype == d) return t;
  Tensor& c = scratch.ensure(t.shape, d);
  ctx.backend.cast(t, c);
  return c;
}

Tensor Layer::weights(Context& ctx, const Param& p, OwnedTensor& scratch) const {
  const DType d = dtype(ctx);
  if (d == p.work.dtype) return p.work;
  if (d == DType::f32) return p.master;
  MemoryScope in(MemCategory::working);
  Tensor& c = scratch.ensure(p.shape, d);
  ctx.backend.cast(p.master, c);
  return c;
}

Tensor Layer::grad_target(Context& ctx, const Param& p, OwnedTensor& scratch) const {
  const DType d = dtype(ctx);
  if (d == p.grad.dtype) return p.grad;
  MemoryScope in(MemCategory::gradients);
  return scratch.ensure(p.shape, d);
}

void Layer::commit_grad(Context& ctx, const Param& p, const Tensor& target) const {
  if (target.data != p.grad.data) ctx.backend.cast(target, p.grad);
}

size_t Layer::activation_bytes() {
  size_t n = 0;
  for (const OwnedTensor* t : activation_buffers()) n += t->buffer.bytes();
  return n;
}

void Layer::release_activations() {
  for (OwnedTensor* t : activation_buffers()) *t = OwnedTensor{};
}

Tensor relu_masked(Context& ctx, Activation act, const Tensor& y, const Tensor& dy,
                   OwnedTensor& scratch) {
  if (act != Activation::relu) return dy;
  Tensor& g = scratch.ensure(dy.shape, dy.dtype);
  ctx.backend.relu_backward(y, dy, g);
  return g;
}

}  // namespace ringtrain
