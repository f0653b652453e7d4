// The CPU backend: matrix products through oneDNN or OpenBLAS (chosen by the CPU's features,
// kernels/cpu/cpu_features.hpp), OpenMP loops for the rest. bf16 GEMMs and convolutions run
// natively where oneDNN has kernels for them, else widened to fp32 (the reference path).
// The reference backend: always built, and every other backend is tested against it.
#pragma once

#include <memory>
#include <vector>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/onednn_conv.hpp"
#include "kernels/cpu/onednn_matmul.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain::kernels::cpu {

// How the backend computes; from_env() reads RINGTRAIN_GEMM and RINGTRAIN_CONV (an input
// error names a bad value), tests set the fields directly.
struct CpuOptions {
  GemmProvider gemm = GemmProvider::openblas;
  bool conv_onednn = true;  // convolution through oneDNN, else im2col + OpenBLAS
  // 16-bit GEMMs and convolutions on the 16-bit inputs where oneDNN has kernels for them;
  // false: always widened to fp32 first (the reference path).
  bool native16 = true;
  // Activations between oneDNN convolutions and max pooling stay in the layout oneDNN's
  // kernels want (activation_layout()); default on with AVX-512.
  bool blocked_layout = true;
  // oneDNN's Winograd convolution for 3x3 stride-1 fp32 layers of 16+ channels (else direct).
  bool conv_winograd = true;
  // Attention as oneDNN tile GEMMs (cpu_attention_gemm.cpp) or our own fp32 tile kernels
  // (cpu_attention.cpp, attention_tiles.hpp). automatic: oneDNN when it is the GEMM provider
  // and runs them on native 16-bit inputs (AMX); in fp32 our kernels are faster, each oneDNN
  // call costing more than a small tile's arithmetic.
  enum class AttentionPath { automatic, gemm, tile_kernels } attention = AttentionPath::automatic;
  // Our attention tile kernels in their AVX-512 build where the CPU has it; false: their
  // baseline x86-64 build (so tests can check both on one machine).
  bool attention_avx512 = true;
  static CpuOptions from_env();
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : CpuBackend(threads, CpuOptions::from_env()) {}
  CpuBackend(int threads, const CpuOptions& opts) : opts_(opts) { set_threads(threads); }
  const CpuOptions& options() const { return opts_; }
  // True when a GEMM or convolution with inputs of this 16-bit dtype runs natively.
  bool native(DType in);
  const char* name() const override { return "cpu"; }
  Device device() const override { return Device{}; }
  void set_threads(int n) override;
  int threads() const override { return threads_; }
  Layout activation_layout(DType compute) override;  // cpu_conv.cpp
  // The families of kernels/cpu/families.hpp, registered once per process.
  const KernelTable& kernel_table() const override;
  KernelEnv kernel_env() const override { return KernelEnv{threads_, nullptr}; }

 protected:
  void do_gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
               float beta, const Tensor& c) override;
  void do_cast(const Tensor& src, const Tensor& dst) override;
  // oneDNN adds the bias to the fp32 accumulator before the one rounding into c.
  void do_gemm_bias(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b,
                    const Tensor& bias, const Tensor& c) override;
  void do_bias_add(const Tensor& y, const Tensor& bias, Activation act) override;
  void do_bias_grad(const Tensor& dy, const Tensor& db) override;
  void do_relu(const Tensor& x, const Tensor& y) override;
  void do_relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) override;
  XentResult do_softmax_xent(const Tensor& logits, const Tensor& labels, float grad_scale,
                             const Tensor* dlogits, float label_smoothing) override;
  bool do_unscale_check(const Tensor& in, float factor, const Tensor& out) override;
  bool do_any_nonfinite(const Tensor& x) override;
  double do_sum_squares(const Tensor& x) override;
  void do_scale(const Tensor& x, float factor) override;
  void do_sgd_step(const SgdConfig& cfg, const Tensor& param, const Tensor& grad,
                   const Tensor* momentum, const Tensor* work) override;
  void do_adamw_step(const AdamWConfig& cfg, const Tensor& param, const Tensor& grad,
                     const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* work) override;

  // cpu_conv.cpp: convolution (im2col + GEMM) and pooling
  void do_conv2d_forward(const ConvShape& cs, const Tensor& x, const Tensor& w, const Tensor* bias,
                         Activation act, const Tensor& y) override;
  void do_conv2d_backward_data(const ConvShape& cs, const Tensor& dy, const Tensor& w,
                               const Tensor& dx) override;
  void do_conv2d_backward(const ConvShape& cs, const Tensor& x, const Tensor& dy, const Tensor& w,
                          const Tensor* dx, const Tensor& dw, const Tensor* db) override;
  void do_conv2d_backward_filter(const ConvShape& cs, const Tensor& x, const Tensor& dy,
                                 const Tensor& dw, const Tensor* db) override;
  void do_maxpool2d_forward(const PoolShape& ps, const Tensor& x, const Tensor& y,
                            const Tensor& argmax) override;
  void do_maxpool2d_backward(const PoolShape& ps, const Tensor& dy, const Tensor& argmax,
                             const Tensor& dx) override;
  void do_avgpool_global_forward(const Tensor& x, const Tensor& y) override;
  void do_avgpool_global_backward(const Tensor& dy, const Tensor& dx) override;
  // cpu_batchnorm.cpp: batch norm; cpu_pointwise.cpp: GELU, dropout, add
  void do_batchnorm_forward(const BatchNormConfig& cfg, bool training, const Tensor& x,
                            const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                            const Tensor& running_var, const Tensor& y, const Tensor& mean,
                            const Tensor& invstd) override;
  void do_batchnorm_backward(bool training, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                             const Tensor& mean, const Tensor& invstd, const Tensor& dx,
                             const Tensor& dgamma, const Tensor& dbeta) override;
  void do_dropout_forward(const Tensor& x, float p, uint64_t seed, const Tensor& y,
                          const Tensor& mask) override;
  void do_dropout_backward(const Tensor& dy, const Tensor& mask, float p,
                           const Tensor& dx) override;
  void do_add(const Tensor& a, const Tensor& b, const Tensor& y) override;
  // cpu_embedding.cpp, cpu_layernorm.cpp, cpu_attention.cpp, cpu_gelu_tanh.cpp,
  // cpu_token_xent.cpp: the transformer ops
  void do_embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor* wpe,
                            const Tensor& y) override;
  void do_embedding_backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte,
                             const Tensor* dwpe) override;
  void do_layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                            const Tensor& y, const Tensor& mean, const Tensor& rstd) override;
  void do_layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                             const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                             const Tensor& dgamma, const Tensor& dbeta) override;
  void do_attention_forward(int64_t heads, const Tensor& qkv, const Tensor& out,
                            const Tensor& lse) override;
  void do_attention_backward(int64_t heads, const Tensor& qkv, const Tensor& out,
                             const Tensor& dout, const Tensor& lse, const Tensor& dqkv) override;
  XentResult do_token_xent(const Tensor& logits, const Tensor& targets, int64_t vocab,
                           float grad_scale, const Tensor* dlogits) override;
  // the Llama ops: rmsnorm, mul, rope_pack
  void do_rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                          const Tensor& rstd) override;
  void do_rmsnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& weight,
                           const Tensor& rstd, const Tensor& dx, const Tensor& dweight) override;
  void do_mul(const Tensor& a, const Tensor& b, const Tensor& y) override;
  void do_mul_backward(const Tensor& a, const Tensor& b, const Tensor& dy, const Tensor& da,
                       const Tensor& db) override;
  void do_rope_pack(const RopeConfig& cfg, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& qkv) override;
  void do_rope_pack_backward(const RopeConfig& cfg, const Tensor& dqkv, const Tensor& dq,
                             const Tensor& dk, const Tensor& dv) override;
  // cpu_loss.cpp: the losses beyond classification
  double do_pointwise_loss(PointwiseLoss kind, const Tensor& pred, const Tensor& target,
                           float delta, const Tensor* pos_weight, float grad_scale,
                           const Tensor* dpred, bool accumulate) override;
  PixelXentResult do_pixel_xent(const Tensor& logits, const Tensor& labels, int32_t ignore_index,
                                float grad_scale, const Tensor* dlogits, bool accumulate) override;

 private:
  // gemm, with bias[n] (fp32) added inside oneDNN's matmul when given.
  void gemm_impl(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                 float beta, const Tensor& c, const float* bias);
  // fp32 view of a tensor: the tensor itself when fp32, else a converted copy in `scratch`.
  const float* as_f32(const Tensor& t, std::vector<float>& scratch);
  // cpu_maxpool_blocked.cpp: max pooling of a blocked or nhwc input (ps.x_layout).
  void maxpool2d_forward_blocked(const PoolShape& ps, const Tensor& x, const Tensor& y,
                                 const Tensor& argmax);
  void maxpool2d_backward_blocked(const PoolShape& ps, const Tensor& dy, const Tensor& argmax,
                                  const Tensor& dx);

  // The dtype a GEMM / convolution with inputs a and b computes on: their own 16-bit dtype
  // when it runs natively, else fp32 (both widened).
  DType compute_dtype(const Tensor& a, const Tensor& b);
  // a as `want` (itself, or converted into scratch).
  const void* as_dtype(const Tensor& t, DType want, std::vector<float>& scratch);
  OneDnnMatmul& matmul();
  // cpu_attention_gemm.cpp: attention as tile GEMMs through oneDNN (when it is the GEMM
  // provider), computing on the dtype attention_gemm_dtype gives for the GEMM inputs a, b.
  DType attention_gemm_dtype(const Tensor& a, const Tensor& b);
  // Whether attention with GEMM inputs a and b runs as tile GEMMs (CpuOptions::attention).
  bool attention_as_gemms(const Tensor& a, const Tensor& b);
  void attention_forward_gemm(const AttentionDims& d, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse);
  void attention_backward_gemm(const AttentionDims& d, const Tensor& qkv, const Tensor& out,
                               const Tensor& dout, const Tensor& lse, const Tensor& dqkv);

  CpuOptions opts_;
  int threads_ = 1;
  std::vector<float> scratch_a_, scratch_b_, scratch_c_;
  std::vector<float> col_, out32_;  // convolution: im2col columns, fp32 results
  OneDnnConv* onednn();             // null when im2col + GEMM is chosen
  std::unique_ptr<OneDnnConv> onednn_;
  std::unique_ptr<OneDnnMatmul> matmul_;
};

}  // namespace ringtrain::kernels::cpu
