// Fused optimizer steps of the CPU backend over the flat fp32 master buffer: one pass over
// cache-sized chunks updates the parameters and the optimizer state (a loop the compiler
// vectorises: restrict pointers, no branches), then writes the chunk's compute-dtype
// working copy while it is still in cache. Semantics follow PyTorch's SGD (dampening 0)
// and AdamW (decoupled weight decay).
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"

namespace ringtrain::kernels::cpu {
namespace {

constexpr int64_t kChunk = 1 << 12;  // 16 KiB of each fp32 stream: the working set fits L1/L2

// Runs body(lo, hi) over chunks (in parallel when large), then casts the chunk into the
// working copy.
template <typename Body>
void over_chunks(int64_t n, int threads, const float* p, const Tensor* work, Body body) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(threads) schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    body(lo, hi);
    if (work) {
      char* w = static_cast<char*>(work->data) + lo * int64_t(dtype_size(work->dtype));
      from_f32(p + lo, w, work->dtype, hi - lo, 1);
    }
  }
}

}  // namespace

void CpuBackend::sgd_step(const SgdConfig& cfg, const Tensor& param, const Tensor& grad,
                          const Tensor* momentum, const Tensor* work) {
  const int64_t n = param.numel();
  RT_CHECK(
      grad.numel() == n && (!momentum || momentum->numel() == n) && (!work || work->numel() == n),
      "sgd_step buffers differ in size");
  float* __restrict p = param.as<float>();
  const float* __restrict g = grad.as<float>();
  float* __restrict m = momentum ? momentum->as<float>() : nullptr;
  const float lr = cfg.lr, mu = cfg.momentum, wd = cfg.weight_decay;
  const bool nesterov = cfg.nesterov;
  over_chunks(n, threads_, p, work, [=](int64_t lo, int64_t hi) {
    if (!m) {
      for (int64_t i = lo; i < hi; ++i) p[i] -= lr * (g[i] + wd * p[i]);
    } else if (nesterov) {
      for (int64_t i = lo; i < hi; ++i) {
        const float d = g[i] + wd * p[i];
        m[i] = mu * m[i] + d;
        p[i] -= lr * (d + mu * m[i]);
      }
    } else {
      for (int64_t i = lo; i < hi; ++i) {
        m[i] = mu * m[i] + (g[i] + wd * p[i]);
        p[i] -= lr * m[i];
      }
    }
  });
}

void CpuBackend::adamw_step(const AdamWConfig& cfg, const Tensor& param, const Tensor& grad,
                            const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* work) {
  const int64_t n = param.numel();
  RT_CHECK(grad.numel() == n && exp_avg.numel() == n && exp_avg_sq.numel() == n &&
               (!work || work->numel() == n),
           "adamw_step buffers differ in size");
  float* __restrict p = param.as<float>();
  const float* __restrict g = grad.as<float>();
  float* __restrict m = exp_avg.as<float>();
  float* __restrict v = exp_avg_sq.as<float>();
  const float b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps;
  const float bc1 = 1.f - float(std::pow(double(b1), double(cfg.step)));
  const float bc2 = 1.f - float(std::pow(double(b2), double(cfg.step)));
  const float step_size = cfg.lr / bc1;
  const float bc2_sqrt = std::sqrt(bc2);
  const float decay = 1.f - cfg.lr * cfg.weight_decay;
  over_chunks(n, threads_, p, work, [=](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float gi = g[i];
      const float mi = b1 * m[i] + (1.f - b1) * gi;
      const float vi = b2 * v[i] + (1.f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    }
  });
}

}  // namespace ringtrain::kernels::cpu
