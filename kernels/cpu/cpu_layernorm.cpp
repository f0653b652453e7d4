// CPU layer normalisation over the last dimension (GPT-2's ln_1, ln_2, ln_f). Each row's
// statistics are fp32, two passes (mean, then the centred sum of squares, as PyTorch); 16-bit
// rows are widened to fp32 once per row. The parameter gradients are summed over fixed blocks
// of rows and the blocks then in order, so they do not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace ringtrain::kernels::cpu {

namespace {

constexpr int64_t kRowBlock = 32;  // rows per partial sum of dgamma / dbeta

// One row: statistics into *mean / *rstd, the normalised row into y (fp32).
RT_INLINE void ln_row_fwd_body(const float* x, const float* g, const float* b, int64_t c, float eps,
                               float* y, float* mean, float* rstd) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < c; ++j) s += x[j];
  const float mu = s / float(c);
  float ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < c; ++j) ss += (x[j] - mu) * (x[j] - mu);
  const float rs = 1.f / std::sqrt(ss / float(c) + eps);
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) y[j] = (x[j] - mu) * rs * g[j] + b[j];
  *mean = mu;
  *rstd = rs;
}

// One row's dx (fp32) and its contribution to the gamma / beta sums.
RT_INLINE void ln_row_bwd_body(const float* x, const float* dy, const float* g, int64_t c, float mu,
                               float rs, float* dx, float* dg, float* db) {
  float sd = 0, sdx = 0;  // mean of g*dy, mean of g*dy*xhat
#pragma omp simd reduction(+ : sd, sdx)
  for (int64_t j = 0; j < c; ++j) {
    const float dn = g[j] * dy[j];
    sd += dn;
    sdx += dn * (x[j] - mu) * rs;
  }
  sd /= float(c);
  sdx /= float(c);
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) {
    const float xhat = (x[j] - mu) * rs;
    dx[j] = rs * (g[j] * dy[j] - sd - xhat * sdx);
    dg[j] += xhat * dy[j];
    db[j] += dy[j];
  }
}

void ln_row_fwd_base(const float* x, const float* g, const float* b, int64_t c, float eps, float* y,
                     float* mean, float* rstd) {
  ln_row_fwd_body(x, g, b, c, eps, y, mean, rstd);
}
RT_AVX512_TARGET void ln_row_fwd_avx512(const float* x, const float* g, const float* b, int64_t c,
                                        float eps, float* y, float* mean, float* rstd) {
  ln_row_fwd_body(x, g, b, c, eps, y, mean, rstd);
}
void ln_row_bwd_base(const float* x, const float* dy, const float* g, int64_t c, float mu, float rs,
                     float* dx, float* dg, float* db) {
  ln_row_bwd_body(x, dy, g, c, mu, rs, dx, dg, db);
}
RT_AVX512_TARGET void ln_row_bwd_avx512(const float* x, const float* dy, const float* g, int64_t c,
                                        float mu, float rs, float* dx, float* dg, float* db) {
  ln_row_bwd_body(x, dy, g, c, mu, rs, dx, dg, db);
}

// Row r of t as fp32: a pointer into t when fp32, else converted into buf.
const float* row_f32(const Tensor& t, int64_t r, int64_t c, float* buf) {
  if (t.dtype == DType::f32) return t.as<float>() + r * c;
  to_f32(static_cast<const char*>(t.data) + r * c * int64_t(dtype_size(t.dtype)), t.dtype, buf, c,
         1);
  return buf;
}

}  // namespace

void CpuBackend::do_layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      float eps, const Tensor& y, const Tensor& mean,
                                      const Tensor& rstd) {
  const int64_t rows = layernorm_rows(x, gamma), c = gamma.numel();
  const float* g = gamma.as<float>();
  const float* b = beta.as<float>();
  const bool avx512 = use_avx512();
  const size_t ysz = dtype_size(y.dtype);
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && rows * c >= kParallelMin)
  {
    std::vector<float> xb(static_cast<size_t>(c)), yb(static_cast<size_t>(c));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = row_f32(x, r, c, xb.data());
      float* yr = y.dtype == DType::f32 ? y.as<float>() + r * c : yb.data();
      if (avx512)
        ln_row_fwd_avx512(xr, g, b, c, eps, yr, mean.as<float>() + r, rstd.as<float>() + r);
      else
        ln_row_fwd_base(xr, g, b, c, eps, yr, mean.as<float>() + r, rstd.as<float>() + r);
      if (y.dtype != DType::f32)
        from_f32(yr, static_cast<char*>(y.data) + r * c * int64_t(ysz), y.dtype, c, 1);
    }
  }
}

void CpuBackend::do_layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                       const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                       const Tensor& dgamma, const Tensor& dbeta) {
  const int64_t rows = layernorm_rows(x, gamma), c = gamma.numel();
  const float* g = gamma.as<float>();
  const bool avx512 = use_avx512();
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  // Per block of rows: dgamma then dbeta partial sums.
  std::vector<float> part(size_t(blocks * 2 * c), 0.f);
  const size_t dsz = dtype_size(dx.dtype);
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && rows * c >= kParallelMin)
  {
    std::vector<float> xb(static_cast<size_t>(c)), db(static_cast<size_t>(c)),
        ob(static_cast<size_t>(c));
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      float* pg = part.data() + blk * 2 * c;
      for (int64_t r = blk * kRowBlock; r < std::min(rows, (blk + 1) * kRowBlock); ++r) {
        const float* xr = row_f32(x, r, c, xb.data());
        const float* dr = row_f32(dy, r, c, db.data());
        float* orow = dx.dtype == DType::f32 ? dx.as<float>() + r * c : ob.data();
        const float mu = mean.as<float>()[r], rs = rstd.as<float>()[r];
        if (avx512)
          ln_row_bwd_avx512(xr, dr, g, c, mu, rs, orow, pg, pg + c);
        else
          ln_row_bwd_base(xr, dr, g, c, mu, rs, orow, pg, pg + c);
        if (dx.dtype != DType::f32)
          from_f32(orow, static_cast<char*>(dx.data) + r * c * int64_t(dsz), dx.dtype, c, 1);
      }
    }
  }
  float* dg = dgamma.as<float>();
  float* dbt = dbeta.as<float>();
#pragma omp parallel for num_threads(threads_) if (threads_ > 1 && blocks * c >= kParallelMin)
  for (int64_t j = 0; j < c; ++j) {
    float sg = 0, sb = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      sg += part[size_t(blk * 2 * c + j)];
      sb += part[size_t(blk * 2 * c + c + j)];
    }
    dg[j] = sg;
    dbt[j] = sb;
  }
}

RT_KERNEL_FAMILY(cpu, layernorm) { table.declare(op_name(Op::layernorm), kFloatDTypes); }
}  // namespace ringtrain::kernels::cpu
