// Backend-neutral helpers of the kernels layer.
#include "kernels/kernels.hpp"

#include "core/error.hpp"

namespace ringtrain::kernels {

void check_conv_shapes(const ConvShape& cs, const Tensor& x, const Tensor& w, const Tensor& y) {
  RT_CHECK(cs.n > 0 && cs.c > 0 && cs.h > 0 && cs.w > 0 && cs.k > 0 && cs.r > 0 && cs.s > 0 &&
               cs.stride > 0 && cs.pad >= 0 && cs.p() > 0 && cs.q() > 0,
           "convolution shape is not valid: input [", cs.n, ", ", cs.c, ", ", cs.h, ", ", cs.w,
           "], filter [", cs.k, ", ", cs.c, ", ", cs.r, ", ", cs.s, "], stride ", cs.stride,
           ", padding ", cs.pad);
  RT_CHECK(x.numel() == cs.n * cs.c * cs.h * cs.w, "convolution input has ", x.numel(),
           " elements, expected ", cs.n * cs.c * cs.h * cs.w);
  RT_CHECK(w.numel() == cs.k * cs.c * cs.r * cs.s, "convolution filter has ", w.numel(),
           " elements, expected ", cs.k * cs.c * cs.r * cs.s);
  RT_CHECK(y.numel() == cs.n * cs.k * cs.p() * cs.q(), "convolution output has ", y.numel(),
           " elements, expected ", cs.n * cs.k * cs.p() * cs.q());
  RT_CHECK((cs.x_layout != Layout::blocked || cs.c % kChannelBlock == 0) &&
               (cs.y_layout != Layout::blocked || cs.k % kChannelBlock == 0),
           "a blocked convolution tensor needs channels in multiples of ", kChannelBlock,
           ": input channels ", cs.c, ", output channels ", cs.k);
}

void check_pool_shapes(const PoolShape& ps, const Tensor& x, const Tensor& y,
                       const Tensor& argmax) {
  const int64_t planes = ps.n * ps.c;
  RT_CHECK(ps.kernel > 0 && ps.stride > 0 && ps.p() > 0 && ps.q() > 0 &&
               x.numel() == planes * ps.h * ps.w && y.numel() == planes * ps.p() * ps.q() &&
               argmax.numel() == y.numel() && argmax.dtype == DType::i32 && x.dtype == y.dtype,
           "max pooling shapes do not match: x ", shape_str(x.shape), " y ", shape_str(y.shape),
           " kernel ", ps.kernel, " stride ", ps.stride);
  RT_CHECK(ps.x_layout != Layout::blocked || ps.c % kChannelBlock == 0,
           "a blocked max pooling input needs channels in multiples of ", kChannelBlock, ", got ",
           ps.c);
}

NchwDims batchnorm_dims(const Tensor& x, const Tensor& gamma) {
  RT_CHECK(x.shape.size() >= 2, "batch norm takes [N, C, ...], got ", shape_str(x.shape));
  NchwDims d{x.dim(0), x.dim(1), 1};
  for (size_t i = 2; i < x.shape.size(); ++i) d.hw *= x.dim(i);
  RT_CHECK(gamma.numel() == d.c && gamma.dtype == DType::f32, "batch norm of ", d.c,
           " channels got fp32 parameters of ", gamma.numel());
  return d;
}

AttentionDims attention_dims(int64_t heads, const Tensor& qkv, const Tensor& out,
                             const Tensor& lse) {
  RT_CHECK(qkv.shape.size() == 3 && qkv.dim(2) % 3 == 0, "attention takes qkv [B, T, 3C], got ",
           shape_str(qkv.shape));
  AttentionDims d{qkv.dim(0), qkv.dim(1), qkv.dim(2) / 3, heads, 0};
  RT_CHECK(heads > 0 && d.c % heads == 0, "attention width ", d.c, " does not divide into ", heads,
           " heads");
  d.hs = d.c / heads;
  RT_CHECK(out.numel() == d.b * d.t * d.c, "attention output ", shape_str(out.shape), " for qkv ",
           shape_str(qkv.shape));
  RT_CHECK(lse.numel() == d.b * heads * d.t && lse.dtype == DType::f32,
           "attention log-sum-exp must be fp32 [", d.b, ", ", heads, ", ", d.t, "], got ",
           dtype_name(lse.dtype), " ", shape_str(lse.shape));
  return d;
}

void check_embedding_shapes(const Tensor& tokens, const Tensor& wte, const Tensor* wpe,
                            const Tensor& y) {
  RT_CHECK(tokens.dtype == DType::i32 && tokens.shape.size() == 2,
           "embedding takes i32 tokens [B, T], got ", dtype_name(tokens.dtype), " ",
           shape_str(tokens.shape));
  RT_CHECK(wte.shape.size() == 2, "token embedding table must be [V, C], got ",
           shape_str(wte.shape));
  const int64_t c = wte.dim(1);
  RT_CHECK(y.numel() == tokens.numel() * c, "embedding output ", shape_str(y.shape), " for ",
           shape_str(tokens.shape), " tokens of width ", c);
  if (wpe)
    RT_CHECK(wpe->shape.size() == 2 && wpe->dim(1) == c && wpe->dim(0) >= tokens.dim(1),
             "positional embedding ", shape_str(wpe->shape), " does not cover ", tokens.dim(1),
             " positions of width ", c);
}

int64_t layernorm_rows(const Tensor& x, const Tensor& gamma) {
  const int64_t c = gamma.numel();
  RT_CHECK(gamma.dtype == DType::f32 && c > 0 && !x.shape.empty() && x.shape.back() == c,
           "layer norm of ", shape_str(x.shape), " with fp32 parameters of ", c);
  return x.numel() / c;
}

RopeDims rope_dims(const RopeConfig& cfg, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& qkv) {
  RT_CHECK(cfg.heads > 0 && cfg.kv_heads > 0 && cfg.heads % cfg.kv_heads == 0 && cfg.head_dim > 0 &&
               cfg.head_dim % 2 == 0 && cfg.theta >= 0,
           "rope_pack of ", cfg.heads, " heads, ", cfg.kv_heads, " kv heads of ", cfg.head_dim,
           " (theta ", cfg.theta, ")");
  RT_CHECK(q.shape.size() == 3, "rope_pack takes q [B, T, H d], got ", shape_str(q.shape));
  const RopeDims d{q.dim(0), q.dim(1)};
  const int64_t hd = cfg.heads * cfg.head_dim, kvd = cfg.kv_heads * cfg.head_dim;
  RT_CHECK(q.dim(2) == hd && k.numel() == d.b * d.t * kvd && v.numel() == d.b * d.t * kvd &&
               qkv.numel() == d.b * d.t * 3 * hd,
           "rope_pack tensors q ", shape_str(q.shape), " k ", shape_str(k.shape), " v ",
           shape_str(v.shape), " qkv ", shape_str(qkv.shape), " do not fit ", cfg.heads, " heads, ",
           cfg.kv_heads, " kv heads of ", cfg.head_dim);
  return d;
}

const char* op_name(Op op) {
  switch (op) {
    case Op::gemm:
      return "gemm";
    case Op::cast:
      return "cast";
    case Op::bias_add:
      return "bias_add";
    case Op::bias_grad:
      return "bias_grad";
    case Op::relu:
      return "relu";
    case Op::relu_backward:
      return "relu_backward";
    case Op::softmax_xent:
      return "softmax_xent";
    case Op::unscale_check:
      return "unscale_check";
    case Op::any_nonfinite:
      return "any_nonfinite";
    case Op::sum_squares:
      return "sum_squares";
    case Op::scale:
      return "scale";
    case Op::sgd_step:
      return "sgd_step";
    case Op::adamw_step:
      return "adamw_step";
    case Op::conv2d:
      return "conv2d";
    case Op::maxpool2d:
      return "maxpool2d";
    case Op::avgpool_global:
      return "avgpool_global";
    case Op::batchnorm:
      return "batchnorm";
    case Op::gelu:
      return "gelu";
    case Op::dropout:
      return "dropout";
    case Op::add:
      return "add";
    case Op::embedding:
      return "embedding";
    case Op::layernorm:
      return "layernorm";
    case Op::attention:
      return "attention";
    case Op::gelu_tanh:
      return "gelu_tanh";
    case Op::token_xent:
      return "token_xent";
    case Op::pointwise_loss:
      return "pointwise_loss";
    case Op::pixel_xent:
      return "pixel_xent";
    case Op::rmsnorm:
      return "rmsnorm";
    case Op::mul:
      return "mul";
    case Op::rope:
      return "rope";
    case Op::fused_unscale:
      return "fused_unscale";
  }
  return "?";
}

const char* pointwise_loss_name(PointwiseLoss kind) {
  switch (kind) {
    case PointwiseLoss::mse:
      return "mse";
    case PointwiseLoss::l1:
      return "l1";
    case PointwiseLoss::huber:
      return "huber";
    case PointwiseLoss::bce_logits:
      return "binary_cross_entropy_with_logits";
  }
  return "?";
}

}  // namespace ringtrain::kernels
