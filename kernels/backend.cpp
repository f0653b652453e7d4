// The shared entry points of kernels::Backend: every op's shape, dtype and device checks,
// made once here for all backends before the backend's kernel runs (kernels.hpp), and the
// kernel table (kernel_table.hpp). A backend's own files hold only what differs between
// backends (a restriction of its library, its memory).
#include <algorithm>

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain::kernels {

// ---- the kernel table -------------------------------------------------------------------

void KernelTable::add(std::string_view op, DType dtype, Entry e) {
  const bool fresh = entries_.emplace(std::pair(std::string(op), dtype), e).second;
  RT_CHECK(fresh, "kernel ", op, " for ", dtype_name(dtype), " is registered twice");
}

void KernelTable::declare(std::string_view op, std::initializer_list<DType> dtypes) {
  for (DType t : dtypes) add(op, t, Entry{});
}

void KernelTable::unary(std::string_view op, std::initializer_list<DType> dtypes,
                        UnaryForward forward, UnaryBackward backward) {
  RT_CHECK(forward && backward, "unary kernel ", op, " needs a forward and a backward function");
  for (DType t : dtypes) add(op, t, Entry{true, UnaryKernel{forward, backward}});
}

bool KernelTable::has(std::string_view op, DType dtype) const {
  return entries_.find(std::pair(std::string(op), dtype)) != entries_.end();
}

const UnaryKernel* KernelTable::find_unary(std::string_view op, DType dtype) const {
  const auto it = entries_.find(std::pair(std::string(op), dtype));
  return it != entries_.end() && it->second.unary ? &it->second.kernel : nullptr;
}

std::vector<std::pair<std::string, DType>> KernelTable::entries() const {
  std::vector<std::pair<std::string, DType>> out;
  for (const auto& [key, e] : entries_) out.push_back(key);
  return out;
}

std::vector<std::string> KernelTable::unary_ops() const {
  std::vector<std::string> out;
  for (const auto& [key, e] : entries_)
    if (e.unary && (out.empty() || out.back() != key.first)) out.push_back(key.first);
  return out;
}

// ---- validation -------------------------------------------------------------------------

void Backend::require(std::string_view op, DType dtype) const {
  RT_CHECK(supports(op, dtype), "the ", name(), " backend has no ", op, " kernel for ",
           dtype_name(dtype));
}

namespace {

struct GemmDims {
  int64_t m, n, k;
};

GemmDims gemm_dims(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b, const Tensor& c) {
  RT_CHECK(a.shape.size() == 2 && b.shape.size() == 2 && c.shape.size() == 2,
           "gemm takes 2-D tensors, got ", shape_str(a.shape), " ", shape_str(b.shape), " ",
           shape_str(c.shape));
  const int64_t m = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
  RT_CHECK(k == kb && c.dim(0) == m && c.dim(1) == n, "gemm shapes do not match: a ",
           shape_str(a.shape), (trans_a ? "^T" : ""), " b ", shape_str(b.shape),
           (trans_b ? "^T" : ""), " c ", shape_str(c.shape));
  return {m, n, k};
}

}  // namespace

void Backend::gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                   float beta, const Tensor& c) {
  gemm_dims(trans_a, trans_b, a, b, c);
  for (const Tensor* t : {&a, &b, &c}) require(Op::gemm, t->dtype);
  check_device(a, "gemm input a");
  check_device(b, "gemm input b");
  check_device(c, "gemm output");
  do_gemm(trans_a, trans_b, alpha, a, b, beta, c);
}

void Backend::gemm_bias(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b,
                        const Tensor& bias, const Tensor& c) {
  const GemmDims d = gemm_dims(trans_a, trans_b, a, b, c);
  RT_CHECK(bias.numel() == d.n, "bias of ", bias.numel(), " for rows of ", d.n);
  for (const Tensor* t : {&a, &b, &c}) require(Op::gemm, t->dtype);
  check_device(a, "gemm input a");
  check_device(b, "gemm input b");
  check_device(bias, "bias");
  check_device(c, "gemm output");
  do_gemm_bias(trans_a, trans_b, a, b, bias, c);
}

void Backend::cast(const Tensor& src, const Tensor& dst) {
  RT_CHECK(src.numel() == dst.numel(), "cast of ", src.numel(), " elements into ", dst.numel());
  require(Op::cast, src.dtype);
  require(Op::cast, dst.dtype);
  check_device(src, "cast source");
  check_device(dst, "cast destination");
  do_cast(src, dst);
}

void Backend::bias_add(const Tensor& y, const Tensor& bias, Activation act) {
  const int64_t rows = y.dim(0), f = y.numel() / rows;
  RT_CHECK(bias.numel() == f, "bias of ", bias.numel(), " for rows of ", f);
  require(Op::bias_add, y.dtype);
  check_device(y, "bias_add output");
  check_device(bias, "bias");
  do_bias_add(y, bias, act);
}

void Backend::bias_grad(const Tensor& dy, const Tensor& db) {
  const int64_t rows = dy.dim(0), f = dy.numel() / rows;
  RT_CHECK(db.numel() == f, "bias gradient of ", db.numel(), " for rows of ", f);
  require(Op::bias_grad, dy.dtype);
  check_device(dy, "bias_grad input");
  check_device(db, "bias gradient");
  do_bias_grad(dy, db);
}

void Backend::relu(const Tensor& x, const Tensor& y) {
  RT_CHECK(x.numel() == y.numel() && x.dtype == y.dtype, "relu shapes/dtypes differ");
  require(Op::relu, x.dtype);
  check_device(x, "relu input");
  check_device(y, "relu output");
  do_relu(x, y);
}

void Backend::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  RT_CHECK(y.numel() == dy.numel() && dy.numel() == dx.numel() && dy.dtype == dx.dtype,
           "relu_backward shapes/dtypes differ");
  require(Op::relu_backward, y.dtype);
  require(Op::relu_backward, dy.dtype);
  check_device(y, "relu output");
  check_device(dy, "relu gradient");
  check_device(dx, "relu input gradient");
  do_relu_backward(y, dy, dx);
}

XentResult Backend::softmax_xent(const Tensor& logits, const Tensor& labels, float grad_scale,
                                 const Tensor* dlogits, float label_smoothing) {
  RT_CHECK(logits.dtype == DType::f32 && labels.dtype == DType::i32,
           "softmax_xent takes fp32 logits and int32 labels");
  RT_CHECK(labels.numel() == logits.dim(0), "labels ", labels.numel(), " for ", logits.dim(0),
           " rows");
  require(Op::softmax_xent, logits.dtype);
  check_device(logits, "logits");
  check_device(labels, "labels");
  if (dlogits) check_device(*dlogits, "logit gradients");
  return do_softmax_xent(logits, labels, grad_scale, dlogits, label_smoothing);
}

bool Backend::unscale_check(const Tensor& in, float factor, const Tensor& out) {
  const bool check_only = out.data == nullptr;  // the optimizer applies the factor
  RT_CHECK(check_only || (out.dtype == DType::f32 && in.numel() == out.numel()),
           "unscale_check into ", dtype_name(out.dtype), " of ", out.numel(), " from ", in.numel());
  require(check_only ? Op::fused_unscale : Op::unscale_check, in.dtype);
  check_device(in, "unscale input");
  if (!check_only) check_device(out, "unscale output");
  return do_unscale_check(in, factor, out);
}

bool Backend::any_nonfinite(const Tensor& x) {
  require(Op::any_nonfinite, x.dtype);
  check_device(x, "checked tensor");
  return do_any_nonfinite(x);
}

double Backend::sum_squares(const Tensor& x) {
  RT_CHECK(x.dtype == DType::f32, "sum_squares takes fp32");
  require(Op::sum_squares, x.dtype);
  check_device(x, "sum_squares input");
  return do_sum_squares(x);
}

void Backend::scale(const Tensor& x, float factor) {
  RT_CHECK(x.dtype == DType::f32, "scale takes fp32");
  require(Op::scale, x.dtype);
  check_device(x, "scaled tensor");
  do_scale(x, factor);
}

void Backend::sgd_step(const SgdConfig& cfg, const Tensor& param, const Tensor& grad,
                       const Tensor* momentum, const Tensor* work) {
  const int64_t n = param.numel();
  RT_CHECK(
      grad.numel() == n && (!momentum || momentum->numel() == n) && (!work || work->numel() == n),
      "sgd_step buffers differ in size");
  RT_CHECK(param.dtype == DType::f32 && (!momentum || momentum->dtype == DType::f32),
           "sgd_step takes fp32 parameters and momentum");
  require(Op::sgd_step, param.dtype);
  // A gradient other than fp32, or scaled, is read by the fused unscale.
  if (grad.dtype != DType::f32 || cfg.grad_scale != 1.f) require(Op::fused_unscale, grad.dtype);
  check_device(param, "parameters");
  check_device(grad, "gradients");
  if (momentum) check_device(*momentum, "momentum");
  if (work) check_device(*work, "working copy");
  do_sgd_step(cfg, param, grad, momentum, work);
}

void Backend::adamw_step(const AdamWConfig& cfg, const Tensor& param, const Tensor& grad,
                         const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* work) {
  const int64_t n = param.numel();
  RT_CHECK(grad.numel() == n && exp_avg.numel() == n && exp_avg_sq.numel() == n &&
               (!work || work->numel() == n),
           "adamw_step buffers differ in size");
  RT_CHECK(
      param.dtype == DType::f32 && exp_avg.dtype == DType::f32 && exp_avg_sq.dtype == DType::f32,
      "adamw_step takes fp32 parameters and moments");
  require(Op::adamw_step, param.dtype);
  if (grad.dtype != DType::f32 || cfg.grad_scale != 1.f) require(Op::fused_unscale, grad.dtype);
  for (const Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq}) check_device(*t, "adamw buffer");
  if (work) check_device(*work, "working copy");
  do_adamw_step(cfg, param, grad, exp_avg, exp_avg_sq, work);
}

// ---- convolutional layers ---------------------------------------------------------------

void Backend::conv2d_forward(const ConvShape& cs, const Tensor& x, const Tensor& w,
                             const Tensor* bias, Activation act, const Tensor& y) {
  check_conv_shapes(cs, x, w, y);
  if (bias)
    RT_CHECK(bias->numel() == cs.k, "convolution bias has ", bias->numel(), " elements, expected ",
             cs.k);
  require(Op::conv2d, x.dtype);
  check_device(x, "convolution input");
  check_device(w, "convolution filter");
  check_device(y, "convolution output");
  if (bias) check_device(*bias, "convolution bias");
  do_conv2d_forward(cs, x, w, bias, act, y);
}

void Backend::conv2d_backward_data(const ConvShape& cs, const Tensor& dy, const Tensor& w,
                                   const Tensor& dx) {
  check_conv_shapes(cs, dx, w, dy);
  require(Op::conv2d, dy.dtype);
  check_device(dy, "convolution output gradient");
  check_device(w, "convolution filter");
  check_device(dx, "convolution input gradient");
  do_conv2d_backward_data(cs, dy, w, dx);
}

void Backend::conv2d_backward_filter(const ConvShape& cs, const Tensor& x, const Tensor& dy,
                                     const Tensor& dw, const Tensor* db) {
  check_conv_shapes(cs, x, dw, dy);
  if (db)
    RT_CHECK(db->numel() == cs.k, "convolution bias gradient has ", db->numel(),
             " elements, expected ", cs.k);
  require(Op::conv2d, x.dtype);
  check_device(x, "convolution input");
  check_device(dy, "convolution output gradient");
  check_device(dw, "convolution filter gradient");
  if (db) check_device(*db, "convolution bias gradient");
  do_conv2d_backward_filter(cs, x, dy, dw, db);
}

void Backend::conv2d_backward(const ConvShape& cs, const Tensor& x, const Tensor& dy,
                              const Tensor& w, const Tensor* dx, const Tensor& dw,
                              const Tensor* db) {
  check_conv_shapes(cs, x, dw, dy);
  if (dx) check_conv_shapes(cs, *dx, w, dy);
  if (db)
    RT_CHECK(db->numel() == cs.k, "convolution bias gradient has ", db->numel(),
             " elements, expected ", cs.k);
  require(Op::conv2d, x.dtype);
  for (const Tensor* t : {&x, &dy, &w, &dw}) check_device(*t, "convolution tensor");
  if (dx) check_device(*dx, "convolution input gradient");
  if (db) check_device(*db, "convolution bias gradient");
  do_conv2d_backward(cs, x, dy, w, dx, dw, db);
}

void Backend::maxpool2d_forward(const PoolShape& ps, const Tensor& x, const Tensor& y,
                                const Tensor& argmax) {
  check_pool_shapes(ps, x, y, argmax);
  require(Op::maxpool2d, x.dtype);
  check_device(x, "max pool input");
  check_device(y, "max pool output");
  check_device(argmax, "max pool argmax");
  do_maxpool2d_forward(ps, x, y, argmax);
}

void Backend::maxpool2d_backward(const PoolShape& ps, const Tensor& dy, const Tensor& argmax,
                                 const Tensor& dx) {
  const int64_t planes = ps.n * ps.c;
  RT_CHECK(dy.numel() == planes * ps.p() * ps.q() && argmax.numel() == dy.numel() &&
               dx.numel() == planes * ps.h * ps.w && dy.dtype == dx.dtype,
           "max pooling gradient shapes do not match: dy ", shape_str(dy.shape), " dx ",
           shape_str(dx.shape));
  RT_CHECK(ps.x_layout != Layout::blocked || ps.c % kChannelBlock == 0,
           "a blocked max pooling gradient needs channels in multiples of ", kChannelBlock,
           ", got ", ps.c);
  require(Op::maxpool2d, dy.dtype);
  check_device(dy, "max pool gradient");
  check_device(argmax, "max pool argmax");
  check_device(dx, "max pool input gradient");
  do_maxpool2d_backward(ps, dy, argmax, dx);
}

void Backend::avgpool_global_forward(const Tensor& x, const Tensor& y) {
  RT_CHECK(x.shape.size() == 4 && y.numel() == x.dim(0) * x.dim(1),
           "global average pooling takes [N, C, H, W] into [N, C], got ", shape_str(x.shape),
           " into ", shape_str(y.shape));
  require(Op::avgpool_global, x.dtype);
  check_device(x, "average pool input");
  check_device(y, "average pool output");
  do_avgpool_global_forward(x, y);
}

void Backend::avgpool_global_backward(const Tensor& dy, const Tensor& dx) {
  RT_CHECK(dx.shape.size() == 4 && dy.numel() == dx.dim(0) * dx.dim(1),
           "global average pooling gradient of ", shape_str(dy.shape), " into ",
           shape_str(dx.shape));
  require(Op::avgpool_global, dy.dtype);
  check_device(dy, "average pool gradient");
  check_device(dx, "average pool input gradient");
  do_avgpool_global_backward(dy, dx);
}

void Backend::batchnorm_forward(const BatchNormConfig& cfg, bool training, const Tensor& x,
                                const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                                const Tensor& running_var, const Tensor& y, const Tensor& mean,
                                const Tensor& invstd) {
  const NchwDims d = batchnorm_dims(x, gamma);
  RT_CHECK(y.numel() == x.numel() && beta.numel() == d.c && running_mean.numel() == d.c &&
               running_var.numel() == d.c && mean.numel() == d.c && invstd.numel() == d.c,
           "batch norm tensors do not match ", d.c, " channels");
  require(Op::batchnorm, x.dtype);
  for (const Tensor* t : {&x, &gamma, &beta, &running_mean, &running_var, &y, &mean, &invstd})
    check_device(*t, "batch norm tensor");
  do_batchnorm_forward(cfg, training, x, gamma, beta, running_mean, running_var, y, mean, invstd);
}

void Backend::batchnorm_backward(bool training, const Tensor& x, const Tensor& dy,
                                 const Tensor& gamma, const Tensor& mean, const Tensor& invstd,
                                 const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  const NchwDims d = batchnorm_dims(x, gamma);
  RT_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && dgamma.numel() == d.c &&
               dbeta.numel() == d.c && dgamma.dtype == DType::f32 && dbeta.dtype == DType::f32,
           "batch norm gradient tensors do not match ", d.c, " channels");
  require(Op::batchnorm, x.dtype);
  for (const Tensor* t : {&x, &dy, &gamma, &mean, &invstd, &dx, &dgamma, &dbeta})
    check_device(*t, "batch norm tensor");
  do_batchnorm_backward(training, x, dy, gamma, mean, invstd, dx, dgamma, dbeta);
}

// ---- pointwise ----------------------------------------------------------------------------

void Backend::unary(std::string_view op, const Tensor& x, const Tensor& y) {
  RT_CHECK(x.numel() == y.numel(), op, " of ", x.numel(), " elements into ", y.numel());
  require(op, x.dtype);
  require(op, y.dtype);
  const UnaryKernel* k = kernel_table().find_unary(op, x.dtype);
  RT_CHECK(k != nullptr, op, " is not a pointwise kernel of the ", name(), " backend");
  check_device(x, "pointwise input");
  check_device(y, "pointwise output");
  k->forward(kernel_env(), x, y);
}

void Backend::unary_backward(std::string_view op, const Tensor& x, const Tensor& dy,
                             const Tensor& dx) {
  RT_CHECK(x.numel() == dy.numel() && dy.numel() == dx.numel(), op, "_backward sizes differ");
  for (const Tensor* t : {&x, &dy, &dx}) require(op, t->dtype);
  const UnaryKernel* k = kernel_table().find_unary(op, x.dtype);
  RT_CHECK(k != nullptr, op, " is not a pointwise kernel of the ", name(), " backend");
  check_device(x, "pointwise input");
  check_device(dy, "pointwise output gradient");
  check_device(dx, "pointwise input gradient");
  k->backward(kernel_env(), x, dy, dx);
}

void Backend::dropout_forward(const Tensor& x, float p, uint64_t seed, const Tensor& y,
                              const Tensor& mask) {
  RT_CHECK(x.numel() == y.numel() && mask.numel() == x.numel() && mask.dtype == DType::u8 &&
               x.dtype == y.dtype,
           "dropout tensors do not match");
  RT_CHECK(p >= 0.f && p < 1.f, "dropout probability ", p, " outside [0, 1)");
  require(Op::dropout, x.dtype);
  check_device(x, "dropout input");
  check_device(y, "dropout output");
  check_device(mask, "dropout mask");
  do_dropout_forward(x, p, seed, y, mask);
}

void Backend::dropout_backward(const Tensor& dy, const Tensor& mask, float p, const Tensor& dx) {
  RT_CHECK(dy.numel() == dx.numel() && mask.numel() == dy.numel() && dy.dtype == dx.dtype,
           "dropout gradient tensors do not match");
  require(Op::dropout, dy.dtype);
  check_device(dy, "dropout gradient");
  check_device(mask, "dropout mask");
  check_device(dx, "dropout input gradient");
  do_dropout_backward(dy, mask, p, dx);
}

void Backend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
  RT_CHECK(a.numel() == b.numel() && b.numel() == y.numel(), "add of ", a.numel(), " and ",
           b.numel(), " elements into ", y.numel());
  for (const Tensor* t : {&a, &b, &y}) require(Op::add, t->dtype);
  check_device(a, "add input");
  check_device(b, "add input");
  check_device(y, "add output");
  do_add(a, b, y);
}

// ---- transformer ops ----------------------------------------------------------------------

void Backend::embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor* wpe,
                                const Tensor& y) {
  check_embedding_shapes(tokens, wte, wpe, y);
  require(Op::embedding, wte.dtype);
  check_device(tokens, "tokens");
  check_device(wte, "token embedding");
  if (wpe) check_device(*wpe, "positional embedding");
  check_device(y, "embedding output");
  do_embedding_forward(tokens, wte, wpe, y);
}

void Backend::embedding_backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte,
                                 const Tensor* dwpe) {
  check_embedding_shapes(tokens, dwte, dwpe, dy);
  RT_CHECK(dwte.dtype == DType::f32 && (!dwpe || dwpe->dtype == DType::f32),
           "embedding gradients are accumulated in fp32 tensors");
  require(Op::embedding, dy.dtype);
  check_device(tokens, "tokens");
  check_device(dy, "embedding output gradient");
  check_device(dwte, "token embedding gradient");
  if (dwpe) check_device(*dwpe, "positional embedding gradient");
  do_embedding_backward(tokens, dy, dwte, dwpe);
}

void Backend::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                                const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const int64_t rows = layernorm_rows(x, gamma), c = gamma.numel();
  RT_CHECK(beta.numel() == c && beta.dtype == DType::f32 && y.numel() == x.numel() &&
               mean.numel() == rows && rstd.numel() == rows && mean.dtype == DType::f32 &&
               rstd.dtype == DType::f32,
           "layer norm tensors do not match ", rows, " rows of ", c);
  require(Op::layernorm, x.dtype);
  for (const Tensor* t : {&x, &gamma, &beta, &y, &mean, &rstd}) check_device(*t, "layer norm");
  do_layernorm_forward(x, gamma, beta, eps, y, mean, rstd);
}

void Backend::layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                 const Tensor& dgamma, const Tensor& dbeta) {
  const int64_t rows = layernorm_rows(x, gamma), c = gamma.numel();
  RT_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && dgamma.numel() == c &&
               dbeta.numel() == c && dgamma.dtype == DType::f32 && dbeta.dtype == DType::f32 &&
               mean.numel() == rows && rstd.numel() == rows,
           "layer norm gradient tensors do not match ", rows, " rows of ", c);
  require(Op::layernorm, x.dtype);
  for (const Tensor* t : {&x, &dy, &gamma, &mean, &rstd, &dx, &dgamma, &dbeta})
    check_device(*t, "layer norm gradient");
  do_layernorm_backward(x, dy, gamma, mean, rstd, dx, dgamma, dbeta);
}

void Backend::attention_forward(int64_t heads, const Tensor& qkv, const Tensor& out,
                                const Tensor& lse) {
  attention_dims(heads, qkv, out, lse);
  require(Op::attention, qkv.dtype);
  for (const Tensor* t : {&qkv, &out, &lse}) check_device(*t, "attention");
  do_attention_forward(heads, qkv, out, lse);
}

void Backend::attention_backward(int64_t heads, const Tensor& qkv, const Tensor& out,
                                 const Tensor& dout, const Tensor& lse, const Tensor& dqkv) {
  attention_dims(heads, qkv, out, lse);
  RT_CHECK(dout.numel() == out.numel() && dqkv.numel() == qkv.numel(), "attention gradients ",
           shape_str(dout.shape), " and ", shape_str(dqkv.shape), " do not match ",
           shape_str(out.shape), " and ", shape_str(qkv.shape));
  require(Op::attention, qkv.dtype);
  for (const Tensor* t : {&qkv, &out, &dout, &lse, &dqkv}) check_device(*t, "attention gradient");
  do_attention_backward(heads, qkv, out, dout, lse, dqkv);
}

XentResult Backend::token_xent(const Tensor& logits, const Tensor& targets, int64_t vocab,
                               float grad_scale, const Tensor* dlogits) {
  RT_CHECK(logits.dtype == DType::f32 && targets.dtype == DType::i32 && !logits.shape.empty(),
           "token_xent takes fp32 logits and i32 targets, got ", dtype_name(logits.dtype), " and ",
           dtype_name(targets.dtype));
  const int64_t vp = logits.shape.back(), rows = logits.numel() / (vp ? vp : 1);
  RT_CHECK(vocab > 0 && vocab <= vp && targets.numel() == rows, "token_xent: ", targets.numel(),
           " targets for logits ", shape_str(logits.shape), " over a vocabulary of ", vocab);
  RT_CHECK(!dlogits || (dlogits->dtype == DType::f32 && dlogits->numel() == logits.numel()),
           "token_xent gradient must be fp32 like the logits");
  require(Op::token_xent, logits.dtype);
  check_device(logits, "logits");
  check_device(targets, "targets");
  if (dlogits) check_device(*dlogits, "logit gradients");
  return do_token_xent(logits, targets, vocab, grad_scale, dlogits);
}

double Backend::pointwise_loss(PointwiseLoss kind, const Tensor& pred, const Tensor& target,
                               float delta, const Tensor* pos_weight, float grad_scale,
                               const Tensor* dpred, bool accumulate) {
  RT_CHECK(pred.dtype == DType::f32 && target.dtype == DType::f32 && pred.shape == target.shape &&
               !pred.shape.empty(),
           pointwise_loss_name(kind), " takes fp32 predictions and targets of one shape, got ",
           dtype_name(pred.dtype), " ", shape_str(pred.shape), " and ", dtype_name(target.dtype),
           " ", shape_str(target.shape));
  RT_CHECK(!dpred || (dpred->dtype == DType::f32 && dpred->shape == pred.shape),
           pointwise_loss_name(kind), " gradient must be fp32 of the predictions' shape");
  RT_CHECK(!pos_weight || (kind == PointwiseLoss::bce_logits && pos_weight->dtype == DType::f32 &&
                           pos_weight->numel() == pred.shape.back()),
           "pos_weight of ", pos_weight ? pos_weight->numel() : 0, " values for ",
           pointwise_loss_name(kind), " on ", shape_str(pred.shape));
  RT_CHECK(kind != PointwiseLoss::huber || delta > 0.f, "huber delta ", delta, " must be > 0");
  require(Op::pointwise_loss, pred.dtype);
  check_device(pred, "loss predictions");
  check_device(target, "loss targets");
  if (pos_weight) check_device(*pos_weight, "pos_weight");
  if (dpred) check_device(*dpred, "loss gradient");
  return do_pointwise_loss(kind, pred, target, delta, pos_weight, grad_scale, dpred, accumulate);
}

PixelXentResult Backend::pixel_xent(const Tensor& logits, const Tensor& labels,
                                    int32_t ignore_index, float grad_scale, const Tensor* dlogits,
                                    bool accumulate) {
  Shape expect = labels.shape;
  if (expect.size() >= 1 && logits.shape.size() >= 2)
    expect.insert(expect.begin() + 1, logits.dim(1));
  RT_CHECK(logits.dtype == DType::f32 && labels.dtype == DType::i32 && logits.shape.size() >= 2 &&
               logits.shape == expect,
           "pixel_xent takes fp32 logits [N, C, S...] and i32 labels [N, S...], got ",
           dtype_name(logits.dtype), " ", shape_str(logits.shape), " and ",
           dtype_name(labels.dtype), " ", shape_str(labels.shape));
  RT_CHECK(!dlogits || (dlogits->dtype == DType::f32 && dlogits->shape == logits.shape),
           "pixel_xent gradient must be fp32 of the logits' shape");
  require(Op::pixel_xent, logits.dtype);
  check_device(logits, "logits");
  check_device(labels, "labels");
  if (dlogits) check_device(*dlogits, "logit gradients");
  return do_pixel_xent(logits, labels, ignore_index, grad_scale, dlogits, accumulate);
}

}  // namespace ringtrain::kernels
