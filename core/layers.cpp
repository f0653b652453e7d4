// The layers: forward and backward through the kernels::Backend, under the precision policy
// (compute dtype, per-layer overrides, fp32 where the policy says so).
#include "core/layers.hpp"

#include "core/error.hpp"
#include "core/rng.hpp"

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
  Tensor& c = scratch.ensure(p.shape, d);
  ctx.backend.cast(p.master, c);
  return c;
}

Tensor Layer::grad_target(Context& ctx, const Param& p, OwnedTensor& scratch) const {
  const DType d = dtype(ctx);
  if (d == p.grad.dtype) return p.grad;
  return scratch.ensure(p.shape, d);
}

void Layer::commit_grad(Context& ctx, const Param& p, const Tensor& target) const {
  if (target.data != p.grad.data) ctx.backend.cast(target, p.grad);
}

namespace {

// dy masked by the fused ReLU of a layer whose output was y; `scratch` holds the result.
Tensor relu_masked(Context& ctx, Activation act, const Tensor& y, const Tensor& dy,
                   OwnedTensor& scratch) {
  if (act != Activation::relu) return dy;
  Tensor& g = scratch.ensure(dy.shape, dy.dtype);
  ctx.backend.relu_backward(y, dy, g);
  return g;
}

}  // namespace

// ---- Linear ----------------------------------------------------------------------------

std::vector<ParamSpec> Linear::param_specs() const {
  return {{"weight", {out_, in_}, in_}, {"bias", {out_}, in_, Init::fan_in_uniform, false}};
}

void Linear::bind(std::vector<Param*> params) {
  RT_CHECK(params.size() == 2, "Linear binds 2 params, got ", params.size());
  weight_ = params[0];
  bias_ = params[1];
}

const Tensor& Linear::forward(Context& ctx, const Tensor& x) {
  const int64_t n = x.dim(0);
  RT_REQUIRE(x.numel() == n * in_, "layer ", name(), " expects ", in_,
             " input features per sample, got ", x.numel() / (n ? n : 1), " (input shape ",
             shape_str(x.shape), ")");
  x_shape_ = x.shape;
  const Tensor& xi = in_dtype(ctx, x, xin_);
  x_ = Tensor(xi.data, {n, in_}, xi.dtype, xi.device);
  Tensor& y = y_.ensure({n, out_}, out_dtype(ctx));
  ctx.backend.gemm(false, true, 1.f, x_, weights(ctx, *weight_, w_), 0.f, y);
  ctx.backend.bias_add(y, bias_->master, act_);  // the bias from the fp32 masters
  return y;
}

const Tensor& Linear::backward(Context& ctx, const Tensor& dy_in) {
  const Tensor dy = relu_masked(ctx, act_, y_.view, dy_in, dy_);
  const Tensor dw = grad_target(ctx, *weight_, dw_);
  ctx.backend.gemm(true, false, 1.f, dy, x_, 0.f, dw);  // dW = dy^T x
  commit_grad(ctx, *weight_, dw);
  ctx.backend.bias_grad(dy, bias_->grad);
  if (!needs_input_grad_) return dx_.view;
  Tensor& dx = dx_.ensure({dy.dim(0), in_}, dtype(ctx));
  ctx.backend.gemm(false, false, 1.f, dy, weights(ctx, *weight_, w_), 0.f, dx);  // dx = dy W
  dx.shape = x_shape_;
  return dx;
}

// ---- Conv2D ----------------------------------------------------------------------------

std::vector<ParamSpec> Conv2D::param_specs() const {
  const int64_t fan_in = o_.in_channels * o_.kernel * o_.kernel;
  std::vector<ParamSpec> specs{
      {"weight", {o_.out_channels, o_.in_channels, o_.kernel, o_.kernel}, fan_in}};
  if (o_.bias) specs.push_back({"bias", {o_.out_channels}, fan_in, Init::fan_in_uniform, false});
  return specs;
}

void Conv2D::bind(std::vector<Param*> params) {
  RT_CHECK(params.size() == (o_.bias ? 2u : 1u), "Conv2D binds ", o_.bias ? 2 : 1, " params, got ",
           params.size());
  weight_ = params[0];
  bias_ = o_.bias ? params[1] : nullptr;
}

const Tensor& Conv2D::forward(Context& ctx, const Tensor& x) {
  RT_REQUIRE(x.shape.size() == 4 && x.dim(1) == o_.in_channels, "layer ", name(),
             " expects input [N, ", o_.in_channels, ", H, W], got ", shape_str(x.shape));
  cs_ = {x.dim(0),  x.dim(1),  x.dim(2),  x.dim(3),  o_.out_channels,
         o_.kernel, o_.kernel, o_.stride, o_.padding};
  RT_REQUIRE(cs_.p() > 0 && cs_.q() > 0, "layer ", name(), ": input ", x.dim(2), "x", x.dim(3),
             " is too small for a ", o_.kernel, "x", o_.kernel, " kernel with padding ",
             o_.padding);
  x_ = in_dtype(ctx, x, xin_);
  Tensor& y = y_.ensure({cs_.n, cs_.k, cs_.p(), cs_.q()}, out_dtype(ctx));
  ctx.backend.conv2d_forward(cs_, x_, weights(ctx, *weight_, w_), bias_ ? &bias_->master : nullptr,
                             o_.act, y);
  return y;
}

const Tensor& Conv2D::backward(Context& ctx, const Tensor& dy_in) {
  const Tensor dy = relu_grad_by_next_ ? dy_in : relu_masked(ctx, o_.act, y_.view, dy_in, dy_);
  const Tensor dw = grad_target(ctx, *weight_, dw_);
  ctx.backend.conv2d_backward_filter(cs_, x_, dy, dw, bias_ ? &bias_->grad : nullptr);
  commit_grad(ctx, *weight_, dw);
  if (!needs_input_grad_) return dx_.view;
  Tensor& dx = dx_.ensure(x_.shape, dtype(ctx));
  ctx.backend.conv2d_backward_data(cs_, dy, weights(ctx, *weight_, w_), dx);
  return dx;
}

// ---- activations -----------------------------------------------------------------------

const Tensor& ReLU::forward(Context& ctx, const Tensor& x) {
  const Tensor& xi = in_dtype(ctx, x, xin_);
  Tensor& y = y_.ensure(xi.shape, xi.dtype);
  ctx.backend.relu(xi, y);
  return y;
}

const Tensor& ReLU::backward(Context& ctx, const Tensor& dy) {
  Tensor& dx = dx_.ensure(dy.shape, dtype(ctx));
  Tensor dy_c = dy;
  if (dy.dtype != dx.dtype) {  // gradient arriving in fp32 from an fp32 layer
    ctx.backend.cast(dy, dx);
    dy_c = dx;
  }
  ctx.backend.relu_backward(y_.view, dy_c, dx);
  return dx;
}

const Tensor& GELU::forward(Context& ctx, const Tensor& x) {
  x_ = in_dtype(ctx, x, xin_);
  Tensor& y = y_.ensure(x_.shape, out_dtype(ctx));
  ctx.backend.gelu(x_, y);
  return y;
}

const Tensor& GELU::backward(Context& ctx, const Tensor& dy) {
  Tensor& dx = dx_.ensure(dy.shape, dtype(ctx));
  ctx.backend.gelu_backward(x_, dy, dx);
  return dx;
}

// ---- pooling and reshaping -------------------------------------------------------------

const Tensor& MaxPool2D::forward(Context& ctx, const Tensor& x) {
  RT_REQUIRE(x.shape.size() == 4 && x.dim(2) >= kernel_ && x.dim(3) >= kernel_, "layer ", name(),
             " expects input [N, C, H, W] with H, W >= ", kernel_, ", got ", shape_str(x.shape));
  ps_ = {x.dim(0), x.dim(1), x.dim(2), x.dim(3), kernel_, stride_, relu_input_};
  x_shape_ = x.shape;
  const Tensor& xi = in_dtype(ctx, x, xin_);
  const Shape ys{ps_.n, ps_.c, ps_.p(), ps_.q()};
  Tensor& y = y_.ensure(ys, xi.dtype);
  ctx.backend.maxpool2d_forward(ps_, xi, y, argmax_.ensure(ys, DType::i32));
  return y;
}

const Tensor& MaxPool2D::backward(Context& ctx, const Tensor& dy) {
  Tensor& dx = dx_.ensure(x_shape_, dtype(ctx));
  Tensor g = dy;
  if (dy.dtype != dx.dtype) {
    g = dy_.ensure(dy.shape, dx.dtype);
    ctx.backend.cast(dy, g);
  }
  ctx.backend.maxpool2d_backward(ps_, g, argmax_.view, dx);
  return dx;
}

const Tensor& GlobalAvgPool::forward(Context& ctx, const Tensor& x) {
  RT_REQUIRE(x.shape.size() == 4, "layer ", name(), " expects input [N, C, H, W], got ",
             shape_str(x.shape));
  x_shape_ = x.shape;
  Tensor& y = y_.ensure({x.dim(0), x.dim(1)}, out_dtype(ctx));
  ctx.backend.avgpool_global_forward(x, y);
  return y;
}

const Tensor& GlobalAvgPool::backward(Context& ctx, const Tensor& dy) {
  Tensor& dx = dx_.ensure(x_shape_, dtype(ctx));
  ctx.backend.avgpool_global_backward(dy, dx);
  return dx;
}

const Tensor& Flatten::forward(Context&, const Tensor& x) {
  x_shape_ = x.shape;
  y_ = Tensor(x.data, {x.dim(0), x.numel() / std::max<int64_t>(1, x.dim(0))}, x.dtype, x.device);
  return y_;
}

const Tensor& Flatten::backward(Context&, const Tensor& dy) {
  dx_ = Tensor(dy.data, x_shape_, dy.dtype, dy.device);
  return dx_;
}

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

// ---- BatchNorm2D -----------------------------------------------------------------------

std::vector<ParamSpec> BatchNorm2D::param_specs() const {
  return {{"weight", {c_}, 1, Init::ones, false}, {"bias", {c_}, 1, Init::zeros, false}};
}

std::vector<ParamSpec> BatchNorm2D::buffer_specs() const {
  return {{"running_mean", {c_}, 1, Init::zeros}, {"running_var", {c_}, 1, Init::ones}};
}

void BatchNorm2D::bind(std::vector<Param*> params) {
  RT_CHECK(params.size() == 2, "BatchNorm2D binds 2 params, got ", params.size());
  gamma_ = params[0];
  beta_ = params[1];
}

void BatchNorm2D::bind_buffers(std::vector<StateBuffer*> buffers) {
  RT_CHECK(buffers.size() == 2, "BatchNorm2D binds 2 buffers, got ", buffers.size());
  running_mean_ = buffers[0];
  running_var_ = buffers[1];
}

const Tensor& BatchNorm2D::forward(Context& ctx, const Tensor& x) {
  RT_REQUIRE(x.shape.size() == 4 && x.dim(1) == c_, "layer ", name(), " expects input [N, ", c_,
             ", H, W], got ", shape_str(x.shape));
  training_ = ctx.training;
  x_ = in_dtype(ctx, x, xin_);
  Tensor& y = y_.ensure(x.shape, out_dtype(ctx));
  ctx.backend.batchnorm_forward(cfg_, training_, x_, gamma_->master, beta_->master,
                                running_mean_->value, running_var_->value, y,
                                mean_.ensure({c_}, DType::f32), invstd_.ensure({c_}, DType::f32));
  return y;
}

const Tensor& BatchNorm2D::backward(Context& ctx, const Tensor& dy) {
  Tensor& dx = dx_.ensure(x_.shape, dtype(ctx));
  Tensor& dg = dgamma_.ensure({c_}, DType::f32);
  Tensor& db = dbeta_.ensure({c_}, DType::f32);
  ctx.backend.batchnorm_backward(training_, x_, dy, gamma_->master, mean_.view, invstd_.view, dx,
                                 dg, db);
  // fp32 gradients into the flat gradient buffer (compute dtype), for the reduction.
  ctx.backend.cast(dg, gamma_->grad);
  ctx.backend.cast(db, beta_->grad);
  return dx;
}

// ---- Residual --------------------------------------------------------------------------

Residual::Residual(std::string name, std::vector<std::unique_ptr<Layer>> body,
                   std::vector<std::unique_ptr<Layer>> shortcut)
    : Layer(std::move(name)), body_(std::move(body)), shortcut_(std::move(shortcut)) {
  RT_CHECK(!body_.empty(), "a residual block needs a body");
}

std::vector<Layer*> Residual::children() {
  std::vector<Layer*> out;
  for (auto& l : body_) out.push_back(l.get());
  for (auto& l : shortcut_) out.push_back(l.get());
  return out;
}

namespace {

std::vector<ParamSpec> prefixed(const std::vector<Layer*>& layers, bool buffers) {
  std::vector<ParamSpec> out;
  for (Layer* l : layers)
    for (ParamSpec s : buffers ? l->buffer_specs() : l->param_specs()) {
      s.name = l->name() + "." + s.name;
      out.push_back(std::move(s));
    }
  return out;
}

// Hands each layer its share of `items`, in order.
template <typename T, typename Count, typename Bind>
void distribute(const std::vector<Layer*>& layers, std::vector<T*> items, Count count, Bind bind) {
  size_t at = 0;
  for (Layer* l : layers) {
    const size_t n = count(l);
    RT_CHECK(at + n <= items.size(), "residual block: too few items to bind");
    bind(l, std::vector<T*>(items.begin() + long(at), items.begin() + long(at + n)));
    at += n;
  }
  RT_CHECK(at == items.size(), "residual block: ", items.size() - at, " items left unbound");
}

}  // namespace

std::vector<ParamSpec> Residual::param_specs() const {
  return prefixed(const_cast<Residual*>(this)->children(), false);
}

std::vector<ParamSpec> Residual::buffer_specs() const {
  return prefixed(const_cast<Residual*>(this)->children(), true);
}

void Residual::bind(std::vector<Param*> params) {
  distribute(
      children(), std::move(params), [](Layer* l) { return l->param_specs().size(); },
      [](Layer* l, std::vector<Param*> p) { l->bind(std::move(p)); });
}

void Residual::bind_buffers(std::vector<StateBuffer*> buffers) {
  distribute(
      children(), std::move(buffers), [](Layer* l) { return l->buffer_specs().size(); },
      [](Layer* l, std::vector<StateBuffer*> b) { l->bind_buffers(std::move(b)); });
}

void Residual::set_dtype(DType t) {
  Layer::set_dtype(t);
  for (Layer* l : children()) l->set_dtype(t);
}

const Tensor& Residual::forward(Context& ctx, const Tensor& x) {
  const Tensor* body = &x;
  for (auto& l : body_) body = &l->forward(ctx, *body);
  const Tensor* sc = &x;
  for (auto& l : shortcut_) sc = &l->forward(ctx, *sc);
  RT_REQUIRE(body->shape == sc->shape, "residual block ", name(), ": body output ",
             shape_str(body->shape), " and shortcut output ", shape_str(sc->shape), " differ");
  Tensor& y = y_.ensure(body->shape, out_dtype(ctx));
  ctx.backend.add(*body, *sc, y);
  return y;
}

const Tensor& Residual::backward(Context& ctx, const Tensor& dy) {
  const Tensor* body = &dy;
  for (size_t i = body_.size(); i-- > 0;) body = &body_[i]->backward(ctx, *body);
  const Tensor* sc = &dy;
  for (size_t i = shortcut_.size(); i-- > 0;) sc = &shortcut_[i]->backward(ctx, *sc);
  Tensor& dx = dx_.ensure(body->shape, dtype(ctx));
  ctx.backend.add(*body, *sc, dx);
  return dx;
}

}  // namespace ringtrain
