// CudaBackend: kernels::Backend on one GPU. GEMM through cuBLASLt (cublasGemmEx as the
// fallback; any fp16/bf16 operand on tensor cores, fp32 accumulation; fp32 is strict fp32
// unless RINGTRAIN_CUDA_TF32=1), convolution through cuDNN, everything else our own kernels
// (elementwise.cu, cnn.cu). All work is queued on the device's one compute stream; only
// the ops that return a value to the host (softmax_xent, unscale_check, any_nonfinite,
// sum_squares) wait for it. Tensors must be on this device (checked).
#pragma once

#include <cudnn.h>

#include <array>
#include <memory>
#include <string>
#include <unordered_map>

#include "kernels/cuda/runtime.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain::kernels::cuda {

// A GEMM's cuBLASLt descriptors and the heuristic's algorithm (gemm.cpp).
struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;
  ~GemmPlan() {
    if (op) cublasLtMatmulDescDestroy(op);
    for (auto* l : {a, b, c})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
};

// A convolution's cuDNN descriptors and algorithms (conv.cpp).
struct ConvPlan {
  DType dtype = DType::f32;  // what the convolution runs in
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t fwd = nullptr, bwd_data = nullptr, bwd_filter = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t data_algo{};
  cudnnConvolutionBwdFilterAlgo_t filter_algo{};
  size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;
  ~ConvPlan() {
    for (auto* t : {x, y})
      if (t) cudnnDestroyTensorDescriptor(t);
    if (w) cudnnDestroyFilterDescriptor(w);
    for (auto* c : {fwd, bwd_data, bwd_filter})
      if (c) cudnnDestroyConvolutionDescriptor(c);
  }
};

using GemmKey = std::array<int64_t, 6>;
struct GemmKeyHash {
  size_t operator()(const GemmKey& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ size_t(v)) * 1099511628211ull;
    return h;
  }
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(DeviceRuntime& rt);
  ~CudaBackend() override;
  const char* name() const override { return "cuda"; }
  Device device() const override { return Device{Device::cuda, rt_.index()}; }
  // The families of kernels/cuda/families.hpp, registered once per process.
  const KernelTable& kernel_table() const override;
  KernelEnv kernel_env() const override { return KernelEnv{threads_, rt_.stream()}; }
  void set_threads(int n) override { threads_ = n; }  // host threads: unused by the GPU
  int threads() const override { return threads_; }

  DeviceRuntime& runtime() { return rt_; }
  // Convolution plans that run in fp32 because cuDNN had no deterministic 16-bit algorithm
  // for the shape (each also warned once on stderr); gpu_bench reports the count.
  int conv_fp32_fallbacks() const { return conv_fp32_fallbacks_; }

 protected:
  // 16-bit GEMMs and convolutions need tensor cores of compute capability 7.0 (fp16), 8.0 (bf16).
  bool capable(std::string_view op, DType dtype) const override;
  void check_device(const Tensor& t, const char* what) const override;

  void do_gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
               float beta, const Tensor& c) override;
  void do_cast(const Tensor& src, const Tensor& dst) override;
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

  void do_conv2d_forward(const ConvShape& cs, const Tensor& x, const Tensor& w, const Tensor* bias,
                         Activation act, const Tensor& y) override;
  void do_conv2d_backward_data(const ConvShape& cs, const Tensor& dy, const Tensor& w,
                               const Tensor& dx) override;
  void do_conv2d_backward_filter(const ConvShape& cs, const Tensor& x, const Tensor& dy,
                                 const Tensor& dw, const Tensor* db) override;
  void do_maxpool2d_forward(const PoolShape& ps, const Tensor& x, const Tensor& y,
                            const Tensor& argmax) override;
  void do_maxpool2d_backward(const PoolShape& ps, const Tensor& dy, const Tensor& argmax,
                             const Tensor& dx) override;
  void do_avgpool_global_forward(const Tensor& x, const Tensor& y) override;
  void do_avgpool_global_backward(const Tensor& dy, const Tensor& dx) override;
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
  // transformer_ops.cpp (kernels in transformer.cu)
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
  // loss_ops.cpp: the losses beyond classification
  double do_pointwise_loss(PointwiseLoss kind, const Tensor& pred, const Tensor& target,
                           float delta, const Tensor* pos_weight, float grad_scale,
                           const Tensor* dpred, bool accumulate) override;
  PixelXentResult do_pixel_xent(const Tensor& logits, const Tensor& labels, int32_t ignore_index,
                                float grad_scale, const Tensor* dlogits, bool accumulate) override;

 private:
  cudaStream_t stream() const { return rt_.stream(); }
  // A device scratch block of at least `bytes` (grown, never shrunk). Slots are distinct so
  // that one op can hold several.
  enum Slot { kScratchA, kScratchB, kScratchC, kWorkspace, kReduce, kSlots };
  void* scratch(Slot slot, size_t bytes);
  // t itself when it has dtype `want`, else a converted copy in scratch `slot`.
  Tensor as_dtype(const Tensor& t, DType want, Slot slot);
  // Waits for the stream; the pinned word(s) are then valid.
  void wait();

  // gemm.cpp
  // a and b in one dtype (gemm_types.hpp), c in it or fp32; tf32: fp32 on TF32 tensor cores.
  void gemm_direct(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                   float beta, const Tensor& c, bool tf32);
  // conv.cpp
  ConvPlan& conv_plan(const ConvShape& cs, DType t);

  DeviceRuntime& rt_;
  int threads_ = 1;
  Buffer scratch_[kSlots];
  std::unordered_map<GemmKey, std::unique_ptr<GemmPlan>, GemmKeyHash> gemm_plans_;
  std::unordered_map<std::string, std::unique_ptr<ConvPlan>> conv_plans_;
  int conv_fp32_fallbacks_ = 0;
};

}  // namespace ringtrain::kernels::cuda
