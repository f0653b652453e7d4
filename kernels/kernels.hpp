// kernels::Backend: the one interface behind which all model math runs (design.md).
// The CPU backend (kernels/cpu) is always built and is the reference every other backend
// is tested against. Callers ask `supports(op, dtype)` instead of #ifdef-ing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/tensor.hpp"
#include "kernels/kernel_table.hpp"

namespace ringtrain::kernels {

enum class Op {
  gemm,
  cast,
  bias_add,
  bias_grad,
  relu,
  relu_backward,
  softmax_xent,
  unscale_check,
  any_nonfinite,
  sum_squares,
  scale,
  sgd_step,
  adamw_step,
  conv2d,
  maxpool2d,
  avgpool_global,
  batchnorm,
  gelu,
  dropout,
  add,
  embedding,
  layernorm,
  attention,
  gelu_tanh,
  token_xent,
  pointwise_loss,
  pixel_xent,
  rmsnorm,
  mul,
  rope,
  // sgd_step/adamw_step read a gradient of this dtype times the config's grad_scale (the loss
  // scaler's unscale folded into the optimizer), and unscale_check takes an empty `out`.
  fused_unscale
};

// An activation fused into the op that produces a layer's output (bias_add, conv2d_forward).
enum class Activation { none, relu };

// How an activation [N, C, H, W] lies in memory: plain NCHW, or the channels innermost in
// blocks of B, element (n, c, h, w) at (((n C/B + c/B) H + h) W + w) B + c % B, with B = 16
// (blocked: oneDNN's nChw16c, for C a multiple of 16; what its AVX-512 fp32 kernels want) or
// B = C (nhwc, channels last; what its AMX bf16 kernels want). Both have the plain tensor's
// size, so elementwise ops (casts, ReLU) read them as they read a plain one. Convolution and
// max pooling take the layout their backend's activation_layout() names; nn/model.cpp
// chooses the tensors that stay in it between layers.
enum class Layout { plain, blocked, nhwc };
constexpr int64_t kChannelBlock = 16;
// B of a layout for C channels (0: plain).
inline int64_t channel_block(Layout l, int64_t c) {
  return l == Layout::blocked ? kChannelBlock : l == Layout::nhwc ? c : 0;
}

// A 2-D convolution (cross-correlation, as in PyTorch): input [N, C, H, W], filters
// [K, C, R, S], output [N, K, P, Q], one stride and one zero padding for both axes.
struct ConvShape {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t k = 0, r = 0, s = 0;
  int64_t stride = 1, pad = 0;
  Layout x_layout = Layout::plain;  // of x and dx
  Layout y_layout = Layout::plain;  // of y and dy
  int64_t p() const { return (h + 2 * pad - r) / stride + 1; }
  int64_t q() const { return (w + 2 * pad - s) / stride + 1; }
};

// Max pooling of input [N, C, H, W] with a square window; no padding; floor mode.
// relu_input: the input is a ReLU's output, and the pooling applies that ReLU's gradient
// too (fused): a window whose maximum is not positive gets argmax -1 and routes no
// gradient, which is exactly what the ReLU's mask would have zeroed.
// x_layout: of x, dx and argmax (which only maxpool2d_backward reads); y and dy are plain.
struct PoolShape {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t kernel = 2, stride = 2;
  bool relu_input = false;
  Layout x_layout = Layout::plain;
  int64_t p() const { return (h - kernel) / stride + 1; }
  int64_t q() const { return (w - kernel) / stride + 1; }
};

struct BatchNormConfig {
  float momentum = 0.1f;  // running = (1 - momentum) * running + momentum * batch
  float eps = 1e-5f;
};

// The dropout mask: element i of the step's tensor is kept when
// dropout_uniform(seed, i) >= p. Counter-based (no state), so every backend draws the same
// mask and a resumed run draws the masks of the uninterrupted one.
#if defined(__CUDACC__)
#define RT_HOST_DEVICE __host__ __device__
#else
#define RT_HOST_DEVICE
#endif
RT_HOST_DEVICE inline float dropout_uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(uint32_t(z >> 40)) * (1.f / 16777216.f);  // 24 bits: [0, 1)
}
const char* op_name(Op op);

// The rotary pack of grouped-query attention (rope_pack): `heads` query heads and `kv_heads`
// key/value heads (heads a multiple of it) of `head_dim` d each; theta 0: no rotation.
struct RopeConfig {
  int64_t heads = 1, kv_heads = 1, head_dim = 1;
  double theta = 0;
};

struct XentResult {
  double loss_sum = 0;  // summed over the batch, in double
  int64_t correct = 0;  // argmax(logits) == label
};

// The elementwise losses of pointwise_loss, PyTorch's nn.MSELoss, L1Loss, HuberLoss(delta) and
// BCEWithLogitsLoss(pos_weight), each with reduction 'mean'.
enum class PointwiseLoss { mse, l1, huber, bce_logits };
const char* pointwise_loss_name(PointwiseLoss kind);

// What pixel_xent reports: the summed loss of the counted (not ignored) positions, their
// number, and how many of them the arg-max predicts.
struct PixelXentResult {
  double loss_sum = 0;
  int64_t counted = 0;
  int64_t correct = 0;
};

// grad_scale: the optimizer steps use grad[i] * grad_scale as the gradient (fp32 product,
// rounded once: what unscale_check would have stored); other than 1 only where
// supports(Op::fused_unscale, grad.dtype).
struct SgdConfig {
  float lr = 0.01f, momentum = 0.9f, weight_decay = 0.f;
  bool nesterov = false;
  float grad_scale = 1.f;
};

struct AdamWConfig {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
  int64_t step = 1;  // 1-based, for bias correction
  float grad_scale = 1.f;
};

// Shape checks every backend makes before the ops below (internal errors naming both sides).
void check_conv_shapes(const ConvShape& cs, const Tensor& x, const Tensor& w, const Tensor& y);
void check_pool_shapes(const PoolShape& ps, const Tensor& x, const Tensor& y, const Tensor& argmax);
struct NchwDims {
  int64_t n, c, hw;  // batch, channels, the product of the remaining dimensions
};
NchwDims batchnorm_dims(const Tensor& x, const Tensor& gamma);

// The interface every backend implements. The public methods are the ops the layers call;
// they are not virtual: each validates its shapes and dtypes here, once for every backend
// (kernels/backend.cpp), refuses a dtype the backend's kernel table does not declare, checks
// that every tensor is on the backend's device, and only then calls the backend's kernel —
// its protected do_<op>() method, or for the pointwise ops the table's function (ggml's
// backend interface; NCCL's canConnect before connect).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Device device() const = 0;
  // Whether this backend has a kernel for op on `dtype` (the dtype of the op's main tensor:
  // its input, or the gradient for fused_unscale): the kernel table's answer, narrowed by
  // what this device can run (capable()).
  bool supports(Op op, DType dtype) const { return supports(op_name(op), dtype); }
  bool supports(std::string_view op, DType dtype) const {
    return kernel_table().has(op, dtype) && capable(op, dtype);
  }
  virtual void set_threads(int n) = 0;  // threads of this rank (OpenMP and the BLAS)
  virtual int threads() const = 0;
  // The layout conv2d and maxpool2d keep activations in between layers, for a model that
  // computes in `compute` (Layout::plain: NCHW only, the default).
  virtual Layout activation_layout(DType compute) { return Layout::plain; }
  // The kernels this backend registered (kernel_table.hpp), and what its table kernels see.
  virtual const KernelTable& kernel_table() const = 0;
  virtual KernelEnv kernel_env() const = 0;

  // c = alpha * op(a) * op(b) + beta * c, row-major 2-D; op(x) is x or its transpose.
  // a and b may be any float dtype; products and sums in fp32, rounded once to c.dtype
  // (the numerics of tensor cores).
  void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b, float beta,
            const Tensor& c);
  // c = op(a) * op(b) + bias (bias: fp32 [n], added to every row). A backend that adds the
  // bias inside its GEMM rounds c once (the default: gemm, then bias_add, twice in 16 bits).
  void gemm_bias(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b, const Tensor& bias,
                 const Tensor& c);
  // dst = src converted (any float dtype to any float dtype, same numel), nearest-even.
  void cast(const Tensor& src, const Tensor& dst);
  // y[n, f] = act(y[n, f] + bias[f]), in place; in fp32, rounded once.
  void bias_add(const Tensor& y, const Tensor& bias, Activation act);
  // db[f] = sum over n of dy[n, f], accumulated in fp32.
  void bias_grad(const Tensor& dy, const Tensor& db);
  void relu(const Tensor& x, const Tensor& y);
  // dx = dy where y > 0, else 0 (y is relu's output). dx may alias dy.
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx);
  // Softmax cross-entropy on fp32 logits [N, C] and int32 labels [N], against the target
  // (1 - e) * onehot + e / C (PyTorch's label_smoothing = e; 0: plain cross-entropy). When
  // dlogits is given it receives (softmax - target) * grad_scale / N in fp32.
  XentResult softmax_xent(const Tensor& logits, const Tensor& labels, float grad_scale,
                          const Tensor* dlogits, float label_smoothing = 0.f);
  // out (fp32) = in * factor, fused with the non-finite check of the loss scaler; returns
  // true when any element is inf or nan. out may alias in when both are fp32. Where
  // supports(Op::fused_unscale, in.dtype), out may be empty (no data): the check of
  // in * factor alone, a read-only pass (the optimizer then applies factor as grad_scale).
  bool unscale_check(const Tensor& in, float factor, const Tensor& out);
  bool any_nonfinite(const Tensor& x);        // any inf/nan, any float dtype
  double sum_squares(const Tensor& x);        // fp32 tensor, double accumulation
  void scale(const Tensor& x, float factor);  // fp32, in place

  // Fused optimizer steps over flat fp32 buffers; when `work` is given (the compute-dtype
  // working copy) it receives the new parameters in its dtype in the same pass. grad is
  // fp32, or of any float dtype where supports(Op::fused_unscale, grad.dtype).
  void sgd_step(const SgdConfig& cfg, const Tensor& param, const Tensor& grad,
                const Tensor* momentum, const Tensor* work);
  void adamw_step(const AdamWConfig& cfg, const Tensor& param, const Tensor& grad,
                  const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* work);

  // ---- convolutional layers. Activations in any float dtype, arithmetic in fp32, each
  // result rounded once to its tensor's dtype.
  // y = act(conv(x, w) + bias); bias [K] may be null.
  void conv2d_forward(const ConvShape& cs, const Tensor& x, const Tensor& w, const Tensor* bias,
                      Activation act, const Tensor& y);
  // dx = the gradient of the convolution's input (overwritten).
  void conv2d_backward_data(const ConvShape& cs, const Tensor& dy, const Tensor& w,
                            const Tensor& dx);
  // dw (and db when given) = the gradients of the filters and bias (overwritten).
  void conv2d_backward_filter(const ConvShape& cs, const Tensor& x, const Tensor& dy,
                              const Tensor& dw, const Tensor* db);
  // Both backward passes of one layer, dx only when given: the same results as
  // conv2d_backward_filter then conv2d_backward_data, in one call so that a backend can share
  // what both read (the CPU's oneDNN path puts dy into its layout once, not twice).
  void conv2d_backward(const ConvShape& cs, const Tensor& x, const Tensor& dy, const Tensor& w,
                       const Tensor* dx, const Tensor& dw, const Tensor* db);
  // y [N, C, P, Q] = window maxima; argmax (i32, y's shape, in ps.x_layout) = the winner's
  // index h * W + w within its plane (the first one on ties), or -1 (ps.relu_input, max <= 0).
  void maxpool2d_forward(const PoolShape& ps, const Tensor& x, const Tensor& y,
                         const Tensor& argmax);
  // dx = dy routed to the argmax positions, zero elsewhere (overwritten).
  void maxpool2d_backward(const PoolShape& ps, const Tensor& dy, const Tensor& argmax,
                          const Tensor& dx);
  // y [N, C] = mean of x [N, C, H, W] over H and W; dx = dy / (H W) broadcast.
  void avgpool_global_forward(const Tensor& x, const Tensor& y);
  void avgpool_global_backward(const Tensor& dy, const Tensor& dx);
  // Batch normalisation of x [N, C, H, W] per channel. gamma, beta, the running averages and
  // mean/invstd [C] are fp32. training: statistics of this batch (biased variance for the
  // normalisation, unbiased for the running variance, which is updated with cfg.momentum);
  // otherwise the running averages are used and left alone. mean/invstd receive the
  // statistics used, for the backward pass.
  void batchnorm_forward(const BatchNormConfig& cfg, bool training, const Tensor& x,
                         const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                         const Tensor& running_var, const Tensor& y, const Tensor& mean,
                         const Tensor& invstd);
  // dx (x's dtype), dgamma and dbeta (fp32, overwritten), from the statistics of forward.
  void batchnorm_backward(bool training, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                          const Tensor& mean, const Tensor& invstd, const Tensor& dx,
                          const Tensor& dgamma, const Tensor& dbeta);

  // ---- pointwise ops from the kernel table: y = f(x) and dx = dy * f'(x), x, y, dy and dx
  // of one size and any float dtypes (the kernel is chosen by x's). `op` is the name the
  // family registered ("gelu", "gelu_tanh", "silu").
  void unary(std::string_view op, const Tensor& x, const Tensor& y);
  void unary_backward(std::string_view op, const Tensor& x, const Tensor& dy, const Tensor& dx);
  // The exact GELU, x * Phi(x) (erf form, PyTorch's default), and its gradient.
  void gelu(const Tensor& x, const Tensor& y) { unary("gelu", x, y); }
  void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
    unary_backward("gelu", x, dy, dx);
  }
  // GELU, tanh form (GPT-2's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  void gelu_tanh(const Tensor& x, const Tensor& y) { unary("gelu_tanh", x, y); }
  void gelu_tanh_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
    unary_backward("gelu_tanh", x, dy, dx);
  }

  // y = x * keep / (1 - p), keep per dropout_uniform(seed, i) >= p; mask (u8) = keep.
  void dropout_forward(const Tensor& x, float p, uint64_t seed, const Tensor& y,
                       const Tensor& mask);
  void dropout_backward(const Tensor& dy, const Tensor& mask, float p, const Tensor& dx);
  // y = a + b elementwise (the residual add); y may alias a or b.
  void add(const Tensor& a, const Tensor& b, const Tensor& y);

  // ---- transformer ops (GPT-2 as llm.c computes it). Activations in any float dtype,
  // statistics and accumulation in fp32, each result rounded once to its tensor's dtype.
  // y[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]: tokens i32 [B, T] in [0, V), wte [V, C],
  // wpe [>= T, C] (null: the token embedding alone), y [B, T, C].
  void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor* wpe,
                         const Tensor& y);
  // dwte [V, C] and dwpe [>= T, C] (fp32, overwritten): dy [B, T, C] scattered back and
  // summed, in token order whatever the thread count (deterministic).
  void embedding_backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte,
                          const Tensor* dwpe);
  // Layer normalisation of each row of x [N, C]: y = (x - mean) * rstd * gamma + beta with
  // gamma, beta fp32 [C]; mean and rstd (fp32 [N]) receive the statistics for backward.
  void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                         const Tensor& y, const Tensor& mean, const Tensor& rstd);
  // dx, and dgamma/dbeta (fp32 [C], overwritten) summed over the rows in a fixed order.
  void layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                          const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                          const Tensor& dgamma, const Tensor& dbeta);
  // Causal multi-head self-attention on qkv [B, T, 3C] (q, k and v side by side, head h at
  // columns h * C/heads of each): out [B, T, C] = softmax(q k^T / sqrt(C/heads) + mask) v
  // per head, heads side by side. lse [B, heads, T] (fp32) receives each query's
  // log-sum-exp of its scaled scores: backward recomputes the probabilities from it, so no
  // T x T matrix is ever stored.
  void attention_forward(int64_t heads, const Tensor& qkv, const Tensor& out, const Tensor& lse);
  // dqkv [B, T, 3C] (overwritten) from dout and forward's qkv, out and lse.
  void attention_backward(int64_t heads, const Tensor& qkv, const Tensor& out, const Tensor& dout,
                          const Tensor& lse, const Tensor& dqkv);
  // ---- Llama ops. Activations in any float dtype, arithmetic in fp32, rounded once.
  // RMS normalisation of each row of x [N, C]: y = x * rstd * weight with
  // rstd = 1 / sqrt(mean(x^2) + eps); weight fp32 [C]; rstd (fp32 [N]) kept for backward.
  void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                       const Tensor& rstd);
  // dx, and dweight (fp32 [C], overwritten) summed over the rows in a fixed order.
  void rmsnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& weight, const Tensor& rstd,
                        const Tensor& dx, const Tensor& dweight);
  // y = a * b elementwise (y may alias neither); da = dy * b, db = dy * a.
  void mul(const Tensor& a, const Tensor& b, const Tensor& y);
  void mul_backward(const Tensor& a, const Tensor& b, const Tensor& dy, const Tensor& da,
                    const Tensor& db);
  // The input of attention_forward for grouped-query attention with rotary embeddings:
  // qkv [B, T, 3 H d] from q [B, T, H d], k and v [B, T, KV d]: query head h rotated, key
  // head h / (H / KV) rotated, value head h / (H / KV) copied, each to head h of its third.
  // The rotation of position t (the row within the window) is HF Llama's rotate_half: for
  // i < d/2 and f = theta^(-2i/d), (x_i, x_{i+d/2}) -> (x_i cos tf - x_{i+d/2} sin tf,
  // x_{i+d/2} cos tf + x_i sin tf), angles in double precision.
  void rope_pack(const RopeConfig& cfg, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& qkv);
  // Its backward: dq, dk, dv (overwritten) from dqkv; the query heads sharing a key/value head
  // summed in head order.
  void rope_pack_backward(const RopeConfig& cfg, const Tensor& dqkv, const Tensor& dq,
                          const Tensor& dk, const Tensor& dv);
  // Token-level softmax cross-entropy over the first `vocab` columns of fp32 logits
  // [N, Vp] (Vp >= vocab: the padding columns take no part and get zero gradient) against
  // i32 targets [N] in [0, vocab). When dlogits (fp32 [N, Vp], may alias logits: the
  // classifier is fused, as llm.c's) is given it receives (softmax - onehot) * grad_scale / N.
  // correct counts argmax == target.
  XentResult token_xent(const Tensor& logits, const Tensor& targets, int64_t vocab,
                        float grad_scale, const Tensor* dlogits);
  // An elementwise loss of fp32 predictions against fp32 targets of the same shape [N, ...];
  // returns the sum over all elements (double). When dpred (fp32, pred's shape) is given it
  // receives dloss/dpred * grad_scale / numel (the gradient of the mean), added to what it
  // holds when `accumulate` (terms of a weighted sum). `delta`: huber's; pos_weight: fp32 [K],
  // K the last dimension (bce_logits only; null: 1).
  double pointwise_loss(PointwiseLoss kind, const Tensor& pred, const Tensor& target, float delta,
                        const Tensor* pos_weight, float grad_scale, const Tensor* dpred,
                        bool accumulate = false);
  // Cross-entropy per position of fp32 logits [N, C, S...] against i32 labels [N, S...]
  // (PyTorch's CrossEntropyLoss(ignore_index) on dense targets): positions labelled
  // ignore_index take no part; every other label must be in [0, C). dlogits (fp32) receives
  // (softmax - onehot) * grad_scale / counted, added when `accumulate`.
  PixelXentResult pixel_xent(const Tensor& logits, const Tensor& labels, int32_t ignore_index,
                             float grad_scale, const Tensor* dlogits, bool accumulate = false);

 protected:
  // What this device can run of what the table declares (default: all of it; CUDA narrows
  // 16-bit GEMMs and convolutions by compute capability).
  virtual bool capable(std::string_view op, DType dtype) const { return true; }
  // Internal error unless t is in this backend's memory (default: any memory is).
  virtual void check_device(const Tensor& t, const char* what) const {}

  // The kernels, called with validated arguments (the comments above are their contract).
  virtual void do_gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                       float beta, const Tensor& c) = 0;
  virtual void do_gemm_bias(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b,
                            const Tensor& bias, const Tensor& c) {
    gemm(trans_a, trans_b, 1.f, a, b, 0.f, c);
    bias_add(c, bias, Activation::none);
  }
  virtual void do_cast(const Tensor& src, const Tensor& dst) = 0;
  virtual void do_bias_add(const Tensor& y, const Tensor& bias, Activation act) = 0;
  virtual void do_bias_grad(const Tensor& dy, const Tensor& db) = 0;
  virtual void do_relu(const Tensor& x, const Tensor& y) = 0;
  virtual void do_relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) = 0;
  virtual XentResult do_softmax_xent(const Tensor& logits, const Tensor& labels, float grad_scale,
                                     const Tensor* dlogits, float label_smoothing) = 0;
  virtual bool do_unscale_check(const Tensor& in, float factor, const Tensor& out) = 0;
  virtual bool do_any_nonfinite(const Tensor& x) = 0;
  virtual double do_sum_squares(const Tensor& x) = 0;
  virtual void do_scale(const Tensor& x, float factor) = 0;
  virtual void do_sgd_step(const SgdConfig& cfg, const Tensor& param, const Tensor& grad,
                           const Tensor* momentum, const Tensor* work) = 0;
  virtual void do_adamw_step(const AdamWConfig& cfg, const Tensor& param, const Tensor& grad,
                             const Tensor& exp_avg, const Tensor& exp_avg_sq,
                             const Tensor* work) = 0;
  virtual void do_conv2d_forward(const ConvShape& cs, const Tensor& x, const Tensor& w,
                                 const Tensor* bias, Activation act, const Tensor& y) = 0;
  virtual void do_conv2d_backward_data(const ConvShape& cs, const Tensor& dy, const Tensor& w,
                                       const Tensor& dx) = 0;
  virtual void do_conv2d_backward_filter(const ConvShape& cs, const Tensor& x, const Tensor& dy,
                                         const Tensor& dw, const Tensor* db) = 0;
  virtual void do_conv2d_backward(const ConvShape& cs, const Tensor& x, const Tensor& dy,
                                  const Tensor& w, const Tensor* dx, const Tensor& dw,
                                  const Tensor* db) {
    conv2d_backward_filter(cs, x, dy, dw, db);
    if (dx) conv2d_backward_data(cs, dy, w, *dx);
  }
  virtual void do_maxpool2d_forward(const PoolShape& ps, const Tensor& x, const Tensor& y,
                                    const Tensor& argmax) = 0;
  virtual void do_maxpool2d_backward(const PoolShape& ps, const Tensor& dy, const Tensor& argmax,
                                     const Tensor& dx) = 0;
  virtual void do_avgpool_global_forward(const Tensor& x, const Tensor& y) = 0;
  virtual void do_avgpool_global_backward(const Tensor& dy, const Tensor& dx) = 0;
  virtual void do_batchnorm_forward(const BatchNormConfig& cfg, bool training, const Tensor& x,
                                    const Tensor& gamma, const Tensor& beta,
                                    const Tensor& running_mean, const Tensor& running_var,
                                    const Tensor& y, const Tensor& mean, const Tensor& invstd) = 0;
  virtual void do_batchnorm_backward(bool training, const Tensor& x, const Tensor& dy,
                                     const Tensor& gamma, const Tensor& mean, const Tensor& invstd,
                                     const Tensor& dx, const Tensor& dgamma,
                                     const Tensor& dbeta) = 0;
  virtual void do_dropout_forward(const Tensor& x, float p, uint64_t seed, const Tensor& y,
                                  const Tensor& mask) = 0;
  virtual void do_dropout_backward(const Tensor& dy, const Tensor& mask, float p,
                                   const Tensor& dx) = 0;
  virtual void do_add(const Tensor& a, const Tensor& b, const Tensor& y) = 0;
  virtual void do_embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor* wpe,
                                    const Tensor& y) = 0;
  virtual void do_embedding_backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte,
                                     const Tensor* dwpe) = 0;
  virtual void do_layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                    float eps, const Tensor& y, const Tensor& mean,
                                    const Tensor& rstd) = 0;
  virtual void do_layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                     const Tensor& dgamma, const Tensor& dbeta) = 0;
  virtual void do_attention_forward(int64_t heads, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse) = 0;
  virtual void do_attention_backward(int64_t heads, const Tensor& qkv, const Tensor& out,
                                     const Tensor& dout, const Tensor& lse, const Tensor& dqkv) = 0;
  virtual XentResult do_token_xent(const Tensor& logits, const Tensor& targets, int64_t vocab,
                                   float grad_scale, const Tensor* dlogits) = 0;
  virtual void do_rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                                  const Tensor& rstd) = 0;
  virtual void do_rmsnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& weight,
                                   const Tensor& rstd, const Tensor& dx, const Tensor& dweight) = 0;
  virtual void do_mul(const Tensor& a, const Tensor& b, const Tensor& y) = 0;
  virtual void do_mul_backward(const Tensor& a, const Tensor& b, const Tensor& dy, const Tensor& da,
                               const Tensor& db) = 0;
  virtual void do_rope_pack(const RopeConfig& cfg, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& qkv) = 0;
  virtual void do_rope_pack_backward(const RopeConfig& cfg, const Tensor& dqkv, const Tensor& dq,
                                     const Tensor& dk, const Tensor& dv) = 0;
  virtual double do_pointwise_loss(PointwiseLoss kind, const Tensor& pred, const Tensor& target,
                                   float delta, const Tensor* pos_weight, float grad_scale,
                                   const Tensor* dpred, bool accumulate) = 0;
  virtual PixelXentResult do_pixel_xent(const Tensor& logits, const Tensor& labels,
                                        int32_t ignore_index, float grad_scale,
                                        const Tensor* dlogits, bool accumulate) = 0;

 private:
  // Internal error unless the table declares op for dtype (names the backend, op, dtype).
  void require(std::string_view op, DType dtype) const;
  void require(Op op, DType dtype) const { require(op_name(op), dtype); }
};

// Shape checks shared by every backend's transformer ops (internal errors naming both sides).
struct AttentionDims {
  int64_t b, t, c, heads, hs;  // batch, tokens, width, heads, head size
};
AttentionDims attention_dims(int64_t heads, const Tensor& qkv, const Tensor& out,
                             const Tensor& lse);
void check_embedding_shapes(const Tensor& tokens, const Tensor& wte, const Tensor* wpe,
                            const Tensor& y);
int64_t layernorm_rows(const Tensor& x, const Tensor& gamma);  // N of x [N, C] (any leading)
// B and T of rope_pack's tensors (internal error unless q, k, v and qkv fit cfg and each other).
struct RopeDims {
  int64_t b, t;
};
RopeDims rope_dims(const RopeConfig& cfg, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& qkv);

std::unique_ptr<Backend> make_cpu_backend(int threads);

// Host-memory conversions for code outside the backends (comm's 16-bit reductions, io):
// fp16 uses F16C when the CPU has it; results are bit-identical to the scalar conversions
// of core/dtype.hpp. Single-threaded.
void host_to_f32(const void* src, DType src_dtype, float* dst, int64_t n);
void host_from_f32(const float* src, void* dst, DType dst_dtype, int64_t n);
// "OpenBLAS 0.3.21 (Haswell, pthread, max 64 threads)" or the like, for --version.
std::string blas_version();
// How the CPU backend computes on this machine, one line for the start-up line and --version:
// "cpu isa avx512_core_fp16, GEMM oneDNN (auto: OpenBLAS core Prescott is below avx512),
// bf16 widened (auto: no AMX), fp16 widened (no oneDNN kernels), OpenBLAS core Prescott
// (below avx512)". Reads RINGTRAIN_GEMM and RINGTRAIN_CPU_BF16 (a bad value is named in the line
// instead).
std::string describe_cpu_gemm();

}  // namespace ringtrain::kernels
