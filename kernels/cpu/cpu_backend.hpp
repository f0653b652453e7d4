// The CPU backend: OpenBLAS SGEMM for matrix products, OpenMP loops for the rest.
// The reference backend: always built, and every other backend is tested against it.
#pragma once

#include <vector>

#include "kernels/kernels.hpp"

namespace ringtrain::kernels::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) { set_threads(threads); }
  const char* name() const override { return "cpu"; }
  Device device() const override { return Device{}; }
  bool supports(Op op, DType dtype) const override { return is_float(dtype); }
  void set_threads(int n) override;
  int threads() const override { return threads_; }

  void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b, float beta,
            const Tensor& c) override;
  void cast(const Tensor& src, const Tensor& dst) override;
  void bias_add(const Tensor& y, const Tensor& bias) override;
  void bias_grad(const Tensor& dy, const Tensor& db) override;
  void relu(const Tensor& x, const Tensor& y) override;
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) override;
  XentResult softmax_xent(const Tensor& logits, const Tensor& labels, float grad_scale,
                          const Tensor* dlogits) override;
  bool unscale_check(const Tensor& in, float factor, const Tensor& out) override;
  bool any_nonfinite(const Tensor& x) override;
  double sum_squares(const Tensor& x) override;
  void scale(const Tensor& x, float factor) override;
  void sgd_step(const SgdConfig& cfg, const Tensor& param, const Tensor& grad,
                const Tensor* momentum, const Tensor* work) override;
  void adamw_step(const AdamWConfig& cfg, const Tensor& param, const Tensor& grad,
                  const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* work) override;

 private:
  // fp32 view of a tensor: the tensor itself when fp32, else a converted copy in `scratch`.
  const float* as_f32(const Tensor& t, std::vector<float>& scratch);

  int threads_ = 1;
  std::vector<float> scratch_a_, scratch_b_, scratch_c_;
};

}  // namespace ringtrain::kernels::cpu
