// ForwardingBackend: a Backend that passes every op to another backend, for tools and tests
// that observe or alter a few ops (derive, override those do_<op> methods, call the base or
// inner() for the rest). The pointwise ops of the kernel table need no forwarding method: the
// shared entry point runs the inner backend's table kernels with its KernelEnv.
#pragma once

#include "kernels/kernels.hpp"

namespace ringtrain::kernels {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}
  Backend& inner() { return inner_; }

  const char* name() const override { return inner_.name(); }
  Device device() const override { return inner_.device(); }
  void set_threads(int n) override { inner_.set_threads(n); }
  int threads() const override { return inner_.threads(); }
  Layout activation_layout(DType compute) override { return inner_.activation_layout(compute); }
  const KernelTable& kernel_table() const override { return inner_.kernel_table(); }
  KernelEnv kernel_env() const override { return inner_.kernel_env(); }

 protected:
  // (gemm_bias and conv2d_backward keep Backend's defaults: they call this backend's gemm,
  // bias_add and the two convolution passes, so an override of those sees them too.)
  void do_gemm(bool ta, bool tb, float alpha, const Tensor& a, const Tensor& b, float beta,
               const Tensor& c) override {
    inner_.gemm(ta, tb, alpha, a, b, beta, c);
  }
  void do_cast(const Tensor& s, const Tensor& d) override { inner_.cast(s, d); }
  void do_bias_add(const Tensor& y, const Tensor& b, Activation act) override {
    inner_.bias_add(y, b, act);
  }
  void do_bias_grad(const Tensor& dy, const Tensor& db) override { inner_.bias_grad(dy, db); }
  void do_relu(const Tensor& x, const Tensor& y) override { inner_.relu(x, y); }
  void do_relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) override {
    inner_.relu_backward(y, dy, dx);
  }
  XentResult do_softmax_xent(const Tensor& l, const Tensor& lab, float g, const Tensor* dl,
                             float smoothing) override {
    return inner_.softmax_xent(l, lab, g, dl, smoothing);
  }
  bool do_unscale_check(const Tensor& in, float f, const Tensor& out) override {
    return inner_.unscale_check(in, f, out);
  }
  bool do_any_nonfinite(const Tensor& x) override { return inner_.any_nonfinite(x); }
  double do_sum_squares(const Tensor& x) override { return inner_.sum_squares(x); }
  void do_scale(const Tensor& x, float f) override { inner_.scale(x, f); }
  void do_sgd_step(const SgdConfig& c, const Tensor& p, const Tensor& g, const Tensor* m,
                   const Tensor* w) override {
    inner_.sgd_step(c, p, g, m, w);
  }
  void do_adamw_step(const AdamWConfig& c, const Tensor& p, const Tensor& g, const Tensor& m,
                     const Tensor& v, const Tensor* w) override {
    inner_.adamw_step(c, p, g, m, v, w);
  }
  void do_conv2d_forward(const ConvShape& cs, const Tensor& x, const Tensor& w, const Tensor* b,
                         Activation act, const Tensor& y) override {
    inner_.conv2d_forward(cs, x, w, b, act, y);
  }
  void do_conv2d_backward_data(const ConvShape& cs, const Tensor& dy, const Tensor& w,
                               const Tensor& dx) override {
    inner_.conv2d_backward_data(cs, dy, w, dx);
  }
  void do_conv2d_backward_filter(const ConvShape& cs, const Tensor& x, const Tensor& dy,
                                 const Tensor& dw, const Tensor* db) override {
    inner_.conv2d_backward_filter(cs, x, dy, dw, db);
  }
  void do_maxpool2d_forward(const PoolShape& ps, const Tensor& x, const Tensor& y,
                            const Tensor& am) override {
    inner_.maxpool2d_forward(ps, x, y, am);
  }
  void do_maxpool2d_backward(const PoolShape& ps, const Tensor& dy, const Tensor& am,
                             const Tensor& dx) override {
    inner_.maxpool2d_backward(ps, dy, am, dx);
  }
  void do_avgpool_global_forward(const Tensor& x, const Tensor& y) override {
    inner_.avgpool_global_forward(x, y);
  }
  void do_avgpool_global_backward(const Tensor& dy, const Tensor& dx) override {
    inner_.avgpool_global_backward(dy, dx);
  }
  void do_batchnorm_forward(const BatchNormConfig& c, bool tr, const Tensor& x, const Tensor& g,
                            const Tensor& b, const Tensor& rm, const Tensor& rv, const Tensor& y,
                            const Tensor& mean, const Tensor& invstd) override {
    inner_.batchnorm_forward(c, tr, x, g, b, rm, rv, y, mean, invstd);
  }
  void do_batchnorm_backward(bool tr, const Tensor& x, const Tensor& dy, const Tensor& g,
                             const Tensor& mean, const Tensor& invstd, const Tensor& dx,
                             const Tensor& dg, const Tensor& db) override {
    inner_.batchnorm_backward(tr, x, dy, g, mean, invstd, dx, dg, db);
  }
  void do_dropout_forward(const Tensor& x, float p, uint64_t seed, const Tensor& y,
                          const Tensor& mask) override {
    inner_.dropout_forward(x, p, seed, y, mask);
  }
  void do_dropout_backward(const Tensor& dy, const Tensor& mask, float p,
                           const Tensor& dx) override {
    inner_.dropout_backward(dy, mask, p, dx);
  }
  void do_add(const Tensor& a, const Tensor& b, const Tensor& y) override { inner_.add(a, b, y); }
  void do_embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor* wpe,
                            const Tensor& y) override {
    inner_.embedding_forward(tokens, wte, wpe, y);
  }
  void do_embedding_backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte,
                             const Tensor* dwpe) override {
    inner_.embedding_backward(tokens, dy, dwte, dwpe);
  }
  void do_layernorm_forward(const Tensor& x, const Tensor& g, const Tensor& b, float eps,
                            const Tensor& y, const Tensor& mean, const Tensor& rstd) override {
    inner_.layernorm_forward(x, g, b, eps, y, mean, rstd);
  }
  void do_layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& g, const Tensor& mean,
                             const Tensor& rstd, const Tensor& dx, const Tensor& dg,
                             const Tensor& db) override {
    inner_.layernorm_backward(x, dy, g, mean, rstd, dx, dg, db);
  }
  void do_attention_forward(int64_t heads, const Tensor& qkv, const Tensor& out,
                            const Tensor& lse) override {
    inner_.attention_forward(heads, qkv, out, lse);
  }
  void do_attention_backward(int64_t heads, const Tensor& qkv, const Tensor& out,
                             const Tensor& dout, const Tensor& lse, const Tensor& dqkv) override {
    inner_.attention_backward(heads, qkv, out, dout, lse, dqkv);
  }
  void do_rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                          const Tensor& rstd) override {
    inner_.rmsnorm_forward(x, w, eps, y, rstd);
  }
  void do_rmsnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& rstd,
                           const Tensor& dx, const Tensor& dw) override {
    inner_.rmsnorm_backward(x, dy, w, rstd, dx, dw);
  }
  void do_mul(const Tensor& a, const Tensor& b, const Tensor& y) override { inner_.mul(a, b, y); }
  void do_mul_backward(const Tensor& a, const Tensor& b, const Tensor& dy, const Tensor& da,
                       const Tensor& db) override {
    inner_.mul_backward(a, b, dy, da, db);
  }
  void do_rope_pack(const RopeConfig& cfg, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& qkv) override {
    inner_.rope_pack(cfg, q, k, v, qkv);
  }
  void do_rope_pack_backward(const RopeConfig& cfg, const Tensor& dqkv, const Tensor& dq,
                             const Tensor& dk, const Tensor& dv) override {
    inner_.rope_pack_backward(cfg, dqkv, dq, dk, dv);
  }

  XentResult do_token_xent(const Tensor& logits, const Tensor& targets, int64_t vocab, float g,
                           const Tensor* dl) override {
    return inner_.token_xent(logits, targets, vocab, g, dl);
  }
  double do_pointwise_loss(PointwiseLoss kind, const Tensor& pred, const Tensor& target,
                           float delta, const Tensor* pos_weight, float g, const Tensor* dpred,
                           bool accumulate) override {
    return inner_.pointwise_loss(kind, pred, target, delta, pos_weight, g, dpred, accumulate);
  }
  PixelXentResult do_pixel_xent(const Tensor& logits, const Tensor& labels, int32_t ignore_index,
                                float g, const Tensor* dl, bool accumulate) override {
    return inner_.pixel_xent(logits, labels, ignore_index, g, dl, accumulate);
  }

 private:
  Backend& inner_;
};

}  // namespace ringtrain::kernels
