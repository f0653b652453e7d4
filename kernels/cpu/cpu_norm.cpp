// CPU batch normalisation, GELU, dropout and the residual add. Statistics are accumulated in
// double per channel (two passes), so they do not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"

namespace ringtrain::kernels::cpu {

void CpuBackend::batchnorm_forward(const BatchNormConfig& cfg, bool training, const Tensor& x,
                                   const Tensor& gamma, const Tensor& beta,
                                   const Tensor& running_mean, const Tensor& running_var,
                                   const Tensor& y, const Tensor& mean, const Tensor& invstd) {
  const NchwDims d = batchnorm_dims(x, gamma);
  RT_CHECK(y.numel() == x.numel() && beta.numel() == d.c && running_mean.numel() == d.c &&
               running_var.numel() == d.c && mean.numel() == d.c && invstd.numel() == d.c,
           "batch norm tensors do not match ", d.c, " channels");
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

void CpuBackend::batchnorm_backward(bool training, const Tensor& x, const Tensor& dy,
                                    const Tensor& gamma, const Tensor& mean, const Tensor& invstd,
                                    const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  const NchwDims d = batchnorm_dims(x, gamma);
  RT_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && dgamma.numel() == d.c &&
               dbeta.numel() == d.c && dgamma.dtype == DType::f32 && dbeta.dtype == DType::f32,
           "batch norm gradient tensors do not match ", d.c, " channels");
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

void CpuBackend::gelu(const Tensor& x, const Tensor& y) {
  RT_CHECK(x.numel() == y.numel(), "gelu of ", x.numel(), " elements into ", y.numel());
  const int64_t n = x.numel();
  dispatch_float(x.dtype, [&](auto X) {
    using EX = decltype(X);
    dispatch_float(y.dtype, [&](auto Y) {
      using EY = decltype(Y);
      const auto* px = x.as<typename EX::storage>();
      auto* py = y.as<typename EY::storage>();
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
      for (int64_t i = 0; i < n; ++i) {
        const float v = EX::load(px[i]);
        py[i] = EY::store(0.5f * v * (1.f + std::erf(v * 0.70710678118654752f)));
      }
    });
  });
}

void CpuBackend::gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  RT_CHECK(x.numel() == dy.numel() && dy.numel() == dx.numel(), "gelu_backward sizes differ");
  const int64_t n = x.numel();
  dispatch_float(x.dtype, [&](auto X) {
    using EX = decltype(X);
    dispatch_float(dy.dtype, [&](auto D) {
      using ED = decltype(D);
      dispatch_float(dx.dtype, [&](auto O) {
        using EO = decltype(O);
        const auto* px = x.as<typename EX::storage>();
        const auto* pd = dy.as<typename ED::storage>();
        auto* po = dx.as<typename EO::storage>();
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
        for (int64_t i = 0; i < n; ++i) {
          const float v = EX::load(px[i]);
          const float cdf = 0.5f * (1.f + std::erf(v * 0.70710678118654752f));
          const float pdf = 0.39894228040143268f * std::exp(-0.5f * v * v);
          po[i] = EO::store(ED::load(pd[i]) * (cdf + v * pdf));
        }
      });
    });
  });
}

namespace {

// mask[i] = dropout_uniform(seed, i) >= p. The hash's 64-bit multiplies vectorise with
// AVX-512DQ; the loop is inlined into a baseline and an AVX-512 function, chosen at run time.
__attribute__((always_inline)) inline void dropout_mask_body(uint64_t seed, float p, int64_t begin,
                                                             int64_t end, uint8_t* mask) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) mask[i] = dropout_uniform(seed, uint64_t(i)) >= p;
}

void dropout_mask_base(uint64_t seed, float p, int64_t begin, int64_t end, uint8_t* mask) {
  dropout_mask_body(seed, p, begin, end, mask);
}

__attribute__((target("avx512f,avx512dq"))) void dropout_mask_avx512(uint64_t seed, float p,
                                                                     int64_t begin, int64_t end,
                                                                     uint8_t* mask) {
  dropout_mask_body(seed, p, begin, end, mask);
}

void dropout_mask(uint64_t seed, float p, int64_t begin, int64_t end, uint8_t* mask) {
  static const bool avx512 = __builtin_cpu_supports("avx512dq");
  if (avx512)
    dropout_mask_avx512(seed, p, begin, end, mask);
  else
    dropout_mask_base(seed, p, begin, end, mask);
}

}  // namespace

void CpuBackend::dropout_forward(const Tensor& x, float p, uint64_t seed, const Tensor& y,
                                 const Tensor& mask) {
  RT_CHECK(x.numel() == y.numel() && mask.numel() == x.numel() && mask.dtype == DType::u8 &&
               x.dtype == y.dtype,
           "dropout tensors do not match");
  RT_CHECK(p >= 0.f && p < 1.f, "dropout probability ", p, " outside [0, 1)");
  const int64_t n = x.numel();
  const float keep_scale = 1.f / (1.f - p);
  auto* pm = mask.as<uint8_t>();
  dispatch_float(x.dtype, [&](auto X) {
    using E = decltype(X);
    const auto* px = x.as<typename E::storage>();
    auto* py = y.as<typename E::storage>();
    constexpr int64_t kChunk = 4096;
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
    for (int64_t c = 0; c < n; c += kChunk) {
      const int64_t end = std::min(n, c + kChunk);
      dropout_mask(seed, p, c, end, pm);
      for (int64_t i = c; i < end; ++i) py[i] = E::store(pm[i] ? E::load(px[i]) * keep_scale : 0.f);
    }
  });
}

void CpuBackend::dropout_backward(const Tensor& dy, const Tensor& mask, float p, const Tensor& dx) {
  RT_CHECK(dy.numel() == dx.numel() && mask.numel() == dy.numel() && dy.dtype == dx.dtype,
           "dropout gradient tensors do not match");
  const int64_t n = dy.numel();
  const float keep_scale = 1.f / (1.f - p);
  const auto* pm = mask.as<uint8_t>();
  dispatch_float(dy.dtype, [&](auto D) {
    using E = decltype(D);
    const auto* pd = dy.as<typename E::storage>();
    auto* px = dx.as<typename E::storage>();
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) px[i] = E::store(pm[i] ? E::load(pd[i]) * keep_scale : 0.f);
  });
}

void CpuBackend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
  RT_CHECK(a.numel() == b.numel() && b.numel() == y.numel(), "add of ", a.numel(), " and ",
           b.numel(), " elements into ", y.numel());
  const int64_t n = a.numel();
  dispatch_float(a.dtype, [&](auto A) {
    using EA = decltype(A);
    dispatch_float(b.dtype, [&](auto B) {
      using EB = decltype(B);
      dispatch_float(y.dtype, [&](auto Y) {
        using EY = decltype(Y);
        const auto* pa = a.as<typename EA::storage>();
        const auto* pb = b.as<typename EB::storage>();
        auto* py = y.as<typename EY::storage>();
#pragma omp parallel for num_threads(threads_) if (n >= kParallelMin)
        for (int64_t i = 0; i < n; ++i) py[i] = EY::store(EA::load(pa[i]) + EB::load(pb[i]));
      });
    });
  });
}

}  // namespace ringtrain::kernels::cpu
