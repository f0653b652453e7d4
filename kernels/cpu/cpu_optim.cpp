// Fused optimizer steps of the CPU backend over the flat fp32 master buffer: one pass
// updates the parameters, the optimizer state and the compute-dtype working copy.
// Semantics follow PyTorch's SGD (dampening 0) and AdamW (decoupled weight decay).
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"

namespace ringtrain::kernels::cpu {
namespace {

// Writes p into the working copy (if any) at i, in its dtype.
template <typename Body>
void with_work(const Tensor* work, Body body) {
  if (!work) return body(static_cast<float*>(nullptr), Elem<DType::f32>{});
  dispatch_float(work->dtype, [&](auto W) { body(work->as<typename decltype(W)::storage>(), W); });
}

}  // namespace

void CpuBackend::sgd_step(const SgdConfig& cfg, const Tensor& param, const Tensor& grad,
                          const Tensor* momentum, const Tensor* work) {
  const int64_t n = param.numel();
  RT_CHECK(
      grad.numel() == n && (!momentum || momentum->numel() == n) && (!work || work->numel() == n),
      "sgd_step buffers differ in size");
  float* p = param.as<float>();
  const float* g = grad.as<float>();
  float* m = momentum ? momentum->as<float>() : nullptr;
  with_work(work, [&](auto* w, auto W) {
    using E = decltype(W);
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      float d = g[i] + cfg.weight_decay * p[i];
      if (m) {
        m[i] = cfg.momentum * m[i] + d;
        d = cfg.nesterov ? d + cfg.momentum * m[i] : m[i];
      }
      p[i] -= cfg.lr * d;
      if (w) w[i] = E::store(p[i]);
    }
  });
}

void CpuBackend::adamw_step(const AdamWConfig& cfg, const Tensor& param, const Tensor& grad,
                            const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* work) {
  const int64_t n = param.numel();
  RT_CHECK(grad.numel() == n && exp_avg.numel() == n && exp_avg_sq.numel() == n &&
               (!work || work->numel() == n),
           "adamw_step buffers differ in size");
  float* p = param.as<float>();
  const float* g = grad.as<float>();
  float* m = exp_avg.as<float>();
  float* v = exp_avg_sq.as<float>();
  const float bc1 = 1.f - float(std::pow(double(cfg.beta1), double(cfg.step)));
  const float bc2 = 1.f - float(std::pow(double(cfg.beta2), double(cfg.step)));
  const float step_size = cfg.lr / bc1;
  const float bc2_sqrt = std::sqrt(bc2);
  const float decay = 1.f - cfg.lr * cfg.weight_decay;
  with_work(work, [&](auto* w, auto W) {
    using E = decltype(W);
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      p[i] *= decay;
      m[i] = cfg.beta1 * m[i] + (1.f - cfg.beta1) * g[i];
      v[i] = cfg.beta2 * v[i] + (1.f - cfg.beta2) * g[i] * g[i];
      const float denom = std::sqrt(v[i]) / bc2_sqrt + cfg.eps;
      p[i] -= step_size * m[i] / denom;
      if (w) w[i] = E::store(p[i]);
    }
  });
}

}  // namespace ringtrain::kernels::cpu
