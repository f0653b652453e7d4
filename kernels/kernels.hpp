// kernels::Backend: the one interface behind which all model math runs (design.md).
// The CPU backend (kernels/cpu) is always built and is the reference every other backend
// is tested against. Callers ask `supports(op, dtype)` instead of #ifdef-ing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.hpp"

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
  adamw_step
};
const char* op_name(Op op);

struct XentResult {
  double loss_sum = 0;  // summed over the batch, in double
  int64_t correct = 0;  // argmax(logits) == label
};

struct SgdConfig {
  float lr = 0.01f, momentum = 0.9f, weight_decay = 0.f;
  bool nesterov = false;
};

struct AdamWConfig {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
  int64_t step = 1;  // 1-based, for bias correction
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Device device() const = 0;
  virtual bool supports(Op op, DType dtype) const = 0;
  virtual void set_threads(int n) = 0;  // threads of this rank (OpenMP and the BLAS)
  virtual int threads() const = 0;

  // c = alpha * op(a) * op(b) + beta * c, row-major 2-D; op(x) is x or its transpose.
  // a and b may be any float dtype; products and sums in fp32, rounded once to c.dtype
  // (the numerics of tensor cores).
  virtual void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                    float beta, const Tensor& c) = 0;
  // dst = src converted (any float dtype to any float dtype, same numel), nearest-even.
  virtual void cast(const Tensor& src, const Tensor& dst) = 0;
  // y[n, f] += bias[f], in place; the add in fp32, rounded once.
  virtual void bias_add(const Tensor& y, const Tensor& bias) = 0;
  // db[f] = sum over n of dy[n, f], accumulated in fp32.
  virtual void bias_grad(const Tensor& dy, const Tensor& db) = 0;
  virtual void relu(const Tensor& x, const Tensor& y) = 0;
  // dx = dy where y > 0, else 0 (y is relu's output). dx may alias dy.
  virtual void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) = 0;
  // Softmax cross-entropy on fp32 logits [N, C] and int32 labels [N]. When dlogits is given
  // it receives (softmax - onehot) * grad_scale / N in fp32.
  virtual XentResult softmax_xent(const Tensor& logits, const Tensor& labels, float grad_scale,
                                  const Tensor* dlogits) = 0;
  // out (fp32) = in * factor, fused with the non-finite check of the loss scaler; returns
  // true when any element is inf or nan. out may alias in when both are fp32.
  virtual bool unscale_check(const Tensor& in, float factor, const Tensor& out) = 0;
  virtual bool any_nonfinite(const Tensor& x) = 0;        // any inf/nan, any float dtype
  virtual double sum_squares(const Tensor& x) = 0;        // fp32 tensor, double accumulation
  virtual void scale(const Tensor& x, float factor) = 0;  // fp32, in place

  // Fused optimizer steps over flat fp32 buffers; when `work` is given (the compute-dtype
  // working copy) it receives the new parameters in its dtype in the same pass.
  virtual void sgd_step(const SgdConfig& cfg, const Tensor& param, const Tensor& grad,
                        const Tensor* momentum, const Tensor* work) = 0;
  virtual void adamw_step(const AdamWConfig& cfg, const Tensor& param, const Tensor& grad,
                          const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* work) = 0;
};

std::unique_ptr<Backend> make_cpu_backend(int threads);

// Host-memory conversions for code outside the backends (comm's 16-bit reductions, io):
// fp16 uses F16C when the CPU has it; results are bit-identical to the scalar conversions
// of core/dtype.hpp. Single-threaded.
void host_to_f32(const void* src, DType src_dtype, float* dst, int64_t n);
void host_from_f32(const float* src, void* dst, DType dst_dtype, int64_t n);
// "OpenBLAS 0.3.21 (Haswell, pthread, max 64 threads)" or the like, for --version.
std::string blas_version();

}  // namespace ringtrain::kernels
