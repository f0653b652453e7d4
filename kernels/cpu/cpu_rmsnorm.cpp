// CPU RMS normalisation over the last dimension (Llama's input_layernorm, post_attention_layernorm
// and final norm). Each row's statistic is fp32; 16-bit rows are widened to fp32 once per row.
// The weight's gradient is summed over fixed blocks of rows and the blocks then in order, so it
// does not depend on the thread count (as cpu_layernorm.cpp).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/elem.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace ringtrain::kernels::cpu {

namespace {

constexpr int64_t kRowBlock = 32;  // rows per partial sum of dweight

// One row: y = x * rstd * g (fp32), rstd into *rstd.
RT_INLINE void rms_row_fwd_body(const float* x, const float* g, int64_t c, float eps, float* y,
                                float* rstd) {
  float ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < c; ++j) ss += x[j] * x[j];
  const float rs = 1.f / std::sqrt(ss / float(c) + eps);
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) y[j] = x[j] * rs * g[j];
  *rstd = rs;
}

// One row's dx (fp32) and its contribution to the weight's sums:
// dx = rs * (g dy - xhat mean(g dy xhat)), dg += dy xhat, xhat = x rs.
RT_INLINE void rms_row_bwd_body(const float* x, const float* dy, const float* g, int64_t c,
                                float rs, float* dx, float* dg) {
  float sdx = 0;
#pragma omp simd reduction(+ : sdx)
  for (int64_t j = 0; j < c; ++j) sdx += g[j] * dy[j] * x[j];
  sdx *= rs * rs / float(c);
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) {
    dx[j] = rs * (g[j] * dy[j] - x[j] * sdx);
    dg[j] += dy[j] * x[j] * rs;
  }
}

void rms_row_fwd_base(const float* x, const float* g, int64_t c, float eps, float* y, float* rs) {
  rms_row_fwd_body(x, g, c, eps, y, rs);
}
RT_AVX512_TARGET void rms_row_fwd_avx512(const float* x, const float* g, int64_t c, float eps,
                                         float* y, float* rs) {
  rms_row_fwd_body(x, g, c, eps, y, rs);
}
void rms_row_bwd_base(const float* x, const float* dy, const float* g, int64_t c, float rs,
                      float* dx, float* dg) {
  rms_row_bwd_body(x, dy, g, c, rs, dx, dg);
}
RT_AVX512_TARGET void rms_row_bwd_avx512(const float* x, const float* dy, const float* g, int64_t c,
                                         float rs, float* dx, float* dg) {
  rms_row_bwd_body(x, dy, g, c, rs, dx, dg);
}

// Row r of t as fp32: a pointer into t when fp32, else converted into buf.
const float* row_f32(const Tensor& t, int64_t r, int64_t c, float* buf) {
  if (t.dtype == DType::f32) return t.as<float>() + r * c;
  to_f32(static_cast<const char*>(t.data) + r * c * int64_t(dtype_size(t.dtype)), t.dtype, buf, c,
         1);
  return buf;
}

}  // namespace

void CpuBackend::do_rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps,
                                    const Tensor& y, const Tensor& rstd) {
  const int64_t rows = layernorm_rows(x, weight), c = weight.numel();
  const float* g = weight.as<float>();
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
        rms_row_fwd_avx512(xr, g, c, eps, yr, rstd.as<float>() + r);
      else
        rms_row_fwd_base(xr, g, c, eps, yr, rstd.as<float>() + r);
      if (y.dtype != DType::f32)
        from_f32(yr, static_cast<char*>(y.data) + r * c * int64_t(ysz), y.dtype, c, 1);
    }
  }
}

void CpuBackend::do_rmsnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& weight,
                                     const Tensor& rstd, const Tensor& dx, const Tensor& dweight) {
  const int64_t rows = layernorm_rows(x, weight), c = weight.numel();
  const float* g = weight.as<float>();
  const bool avx512 = use_avx512();
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<float> part(size_t(blocks * c), 0.f);  // per block of rows: dweight's partial sum
  const size_t dsz = dtype_size(dx.dtype);
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && rows * c >= kParallelMin)
  {
    std::vector<float> xb(static_cast<size_t>(c)), db(static_cast<size_t>(c)),
        ob(static_cast<size_t>(c));
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      float* pg = part.data() + blk * c;
      for (int64_t r = blk * kRowBlock; r < std::min(rows, (blk + 1) * kRowBlock); ++r) {
        const float* xr = row_f32(x, r, c, xb.data());
        const float* dr = row_f32(dy, r, c, db.data());
        float* orow = dx.dtype == DType::f32 ? dx.as<float>() + r * c : ob.data();
        const float rs = rstd.as<float>()[r];
        if (avx512)
          rms_row_bwd_avx512(xr, dr, g, c, rs, orow, pg);
        else
          rms_row_bwd_base(xr, dr, g, c, rs, orow, pg);
        if (dx.dtype != DType::f32)
          from_f32(orow, static_cast<char*>(dx.data) + r * c * int64_t(dsz), dx.dtype, c, 1);
      }
    }
  }
  float* dg = dweight.as<float>();
#pragma omp parallel for num_threads(threads_) if (threads_ > 1 && blocks * c >= kParallelMin)
  for (int64_t j = 0; j < c; ++j) {
    float sg = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) sg += part[size_t(blk * c + j)];
    dg[j] = sg;
  }
}

RT_KERNEL_FAMILY(cpu, rmsnorm) { table.declare(op_name(Op::rmsnorm), kFloatDTypes); }
}  // namespace ringtrain::kernels::cpu
