// CPU batch normalisation. Statistics are accumulated in double per channel (two passes), so
// they do not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"

namespace ringtrain::kernels::cpu {

void CpuBackend::do_batchnorm_forward(const BatchNormConfig& cfg, bool training, const Tensor& x,
                                      const Tensor& gamma, const Tensor& beta,
                                      const Tensor& running_mean, const Tensor& running_var,
                                      const Tensor& y, const Tensor& mean, const Tensor& invstd) {
  const NchwDims d = batchnorm_dims(x, gamma);
  const int64_t m = d.n * d.hw;
  const float* g = gamma.as<float>();
  const float* b = beta.as<float>();
  float* rm = running_mean.as<float>();
  float* rv = running_var.as<float>();
  float* pm = mean.as<float>();
  float* pi = invstd.as<float>();
  dispatch_float(x.dtype, [&](auto X) {
    using EX = decltype(X);
    dispatch_float(y.dtype, [&](auto Y) {
      using EY = decltype(Y);
      const auto* px = x.as<typename EX::storage>();
      auto* py = y.as<typename EY::storage>();
#pragma omp parallel for num_threads(threads_) if (threads_ > 1 && d.c > 1)
      for (int64_t c = 0; c < d.c; ++c) {
        float mu, is;
        if (training) {
          double s = 0;
          for (int64_t n = 0; n < d.n; ++n) {
            const auto* row = px + (n * d.c + c) * d.hw;
            for (int64_t i = 0; i < d.hw; ++i) s += EX::load(row[i]);
          }
          const double mu_d = s / double(m);
          double ss = 0;
          for (int64_t n = 0; n < d.n; ++n) {
            const auto* row = px + (n * d.c + c) * d.hw;
            for (int64_t i = 0; i < d.hw; ++i) {
              const double v = double(EX::load(row[i])) - mu_d;
              ss += v * v;
            }
          }
          const double var = ss / double(m);
          mu = float(mu_d);
          is = float(1.0 / std::sqrt(var + double(cfg.eps)));
          const double unbiased = m > 1 ? ss / double(m - 1) : var;
          rm[c] = float((1.0 - cfg.momentum) * rm[c] + cfg.momentum * mu_d);
          rv[c] = float((1.0 - cfg.momentum) * rv[c] + cfg.momentum * unbiased);
        } else {
          mu = rm[c];
          is = float(1.0 / std::sqrt(double(rv[c]) + double(cfg.eps)));
        }
        pm[c] = mu;
        pi[c] = is;
        const float scale = g[c] * is, shift = b[c] - mu * scale;
        for (int64_t n = 0; n < d.n; ++n) {
          const int64_t o = (n * d.c + c) * d.hw;
          for (int64_t i = 0; i < d.hw; ++i)
            py[o + i] = EY::store(EX::load(px[o + i]) * scale + shift);
        }
      }
    });
  });
}

void CpuBackend::do_batchnorm_backward(bool training, const Tensor& x, const Tensor& dy,
                                       const Tensor& gamma, const Tensor& mean,
                                       const Tensor& invstd, const Tensor& dx, const Tensor& dgamma,
                                       const Tensor& dbeta) {
  const NchwDims d = batchnorm_dims(x, gamma);
  const int64_t m = d.n * d.hw;
  const float* g = gamma.as<float>();
  const float* pm = mean.as<float>();
  const float* pi = invstd.as<float>();
  float* dg = dgamma.as<float>();
  float* db = dbeta.as<float>();
  dispatch_float(x.dtype, [&](auto X) {
    using EX = decltype(X);
    dispatch_float(dy.dtype, [&](auto D) {
      using ED = decltype(D);
      dispatch_float(dx.dtype, [&](auto O) {
        using EO = decltype(O);
        const auto* px = x.as<typename EX::storage>();
        const auto* pd = dy.as<typename ED::storage>();
        auto* po = dx.as<typename EO::storage>();
#pragma omp parallel for num_threads(threads_) if (threads_ > 1 && d.c > 1)
        for (int64_t c = 0; c < d.c; ++c) {
          const float mu = pm[c], is = pi[c];
          double sdy = 0, sdyx = 0;
          for (int64_t n = 0; n < d.n; ++n) {
            const int64_t o = (n * d.c + c) * d.hw;
            for (int64_t i = 0; i < d.hw; ++i) {
              const double gy = ED::load(pd[o + i]);
              sdy += gy;
              sdyx += gy * (double(EX::load(px[o + i])) - mu) * is;
            }
          }
          db[c] = float(sdy);
          dg[c] = float(sdyx);
          const float k = g[c] * is;
          const float a = training ? float(sdy / double(m)) : 0.f;
          const float bq = training ? float(sdyx / double(m)) : 0.f;
          for (int64_t n = 0; n < d.n; ++n) {
            const int64_t o = (n * d.c + c) * d.hw;
            for (int64_t i = 0; i < d.hw; ++i) {
              const float xhat = (EX::load(px[o + i]) - mu) * is;
              po[o + i] = EO::store(k * (ED::load(pd[o + i]) - a - xhat * bq));
            }
          }
        }
      });
    });
  });
}

RT_KERNEL_FAMILY(cpu, batchnorm) { table.declare(op_name(Op::batchnorm), kFloatDTypes); }
}  // namespace ringtrain::kernels::cpu
