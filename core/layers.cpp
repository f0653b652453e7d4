// Linear and ReLU: forward and backward through the kernels::Backend.
#include "core/layers.hpp"

#include "core/error.hpp"

namespace ringtrain {

std::vector<ParamSpec> Linear::param_specs() const {
  return {{"weight", {out_, in_}, in_}, {"bias", {out_}, in_}};
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
  x_ = Tensor(x.data, {n, in_}, x.dtype, x.device);
  Tensor& y = y_.ensure({n, out_}, out_dtype(ctx));
  ctx.backend.gemm(false, true, 1.f, x_, weight_->work, 0.f, y);
  ctx.backend.bias_add(y, bias_->work, kernels::Activation::none);
  return y;
}

const Tensor& Linear::backward(Context& ctx, const Tensor& dy) {
  const int64_t n = dy.dim(0);
  ctx.backend.gemm(true, false, 1.f, dy, x_, 0.f, weight_->grad);  // dW = dy^T x
  ctx.backend.bias_grad(dy, bias_->grad);
  if (!needs_input_grad_) return dx_.view;
  Tensor& dx = dx_.ensure({n, in_}, ctx.compute);
  ctx.backend.gemm(false, false, 1.f, dy, weight_->work, 0.f, dx);  // dx = dy W
  return dx;
}

const Tensor& ReLU::forward(Context& ctx, const Tensor& x) {
  Tensor& y = y_.ensure(x.shape, x.dtype);
  ctx.backend.relu(x, y);
  return y;
}

const Tensor& ReLU::backward(Context& ctx, const Tensor& dy) {
  Tensor& dx = dx_.ensure(dy.shape, ctx.compute);
  Tensor dy_c = dy;
  if (dy.dtype != ctx.compute) {  // gradient arriving in fp32 from an fp32 layer
    ctx.backend.cast(dy, dx);
    dy_c = dx;
  }
  ctx.backend.relu_backward(y_.view, dy_c, dx);
  return dx;
}

}  // namespace ringtrain
