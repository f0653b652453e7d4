// The CUDA loss family's kernels (the losses of kernels/cpu/cpu_loss.cpp, term by term, built
// with --fmad=false): one thread per element (pointwise losses) or per position (pixel
// cross-entropy), each writing its loss in double; the host sums them in the CPU's order.
#include <cmath>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.hpp"

namespace ringtrain::kernels::cuda {
namespace {

__device__ double softplus_d(double x) { return fmax(x, 0.0) + log1p(exp(-fabs(x))); }

// kind: 0 mse, 1 l1, 2 huber, 3 bce_logits (kernels::PointwiseLoss's order).
__global__ void pointwise_loss_kernel(int kind, const float* p, const float* t, int64_t n,
                                      int64_t k, double delta, const float* pw, double g, float* d,
                                      int accumulate, double* loss) {
  RT_GRID_STRIDE(i, n) {
    const double pv = p[i], tv = t[i], diff = pv - tv;
    double l = 0, grad = 0;
    if (kind == 0) {
      l = diff * diff;
      grad = 2 * diff;
    } else if (kind == 1) {
      l = fabs(diff);
      grad = diff > 0 ? 1.0 : diff < 0 ? -1.0 : 0.0;
    } else if (kind == 2) {
      if (fabs(diff) < delta) {
        l = 0.5 * diff * diff;
        grad = diff;
      } else {
        l = delta * (fabs(diff) - 0.5 * delta);
        grad = diff > 0 ? delta : -delta;
      }
    } else {
      const double w = pw ? double(pw[i % k]) : 1.0;
      const double sig = 1.0 / (1.0 + exp(-pv));
      grad = sig * (w * tv + 1 - tv) - w * tv;
      l = w * tv * softplus_d(-pv) + (1 - tv) * softplus_d(pv);
    }
    loss[i] = l;
    if (d) d[i] = float(grad * g) + (accumulate ? d[i] : 0.f);
  }
}

// Counts the positions not labelled ignore_index; *bad = 1 when another label is outside [0, c).
__global__ void pixel_count_kernel(const int32_t* labels, int64_t n, int32_t ignore, int64_t c,
                                   unsigned long long* counted, int32_t* bad) {
  RT_GRID_STRIDE(i, n) {
    const int32_t y = labels[i];
    if (y == ignore) continue;
    if (y < 0 || y >= c) *bad = 1;
    atomicAdd(counted, 1ull);
  }
}

__global__ void pixel_xent_kernel(const float* x, const int32_t* labels, int64_t n, int64_t c,
                                  int64_t s, int32_t ignore, double g, float* d, int accumulate,
                                  double* loss, int32_t* correct) {
  RT_GRID_STRIDE(i, n * s) {
    const int64_t b = i / s, q = i % s;
    const float* xb = x + b * c * s + q;
    float* db = d ? d + b * c * s + q : nullptr;
    const int32_t y = labels[i];
    loss[i] = 0;
    correct[i] = 0;
    if (y == ignore || y < 0 || y >= c) {
      if (db && !accumulate)
        for (int64_t j = 0; j < c; ++j) db[j * s] = 0.f;
      continue;
    }
    int64_t arg = 0;
    for (int64_t j = 1; j < c; ++j)
      if (xb[j * s] > xb[arg * s]) arg = j;
    const double mx = xb[arg * s];
    double sum = 0;
    for (int64_t j = 0; j < c; ++j) sum += exp(double(xb[j * s]) - mx);
    const double lse = mx + log(sum);
    loss[i] = lse - double(xb[y * s]);
    correct[i] = arg == y;
    if (db)
      for (int64_t j = 0; j < c; ++j) {
        const double grad = (exp(double(xb[j * s]) - lse) - (j == y ? 1.0 : 0.0)) * g;
        db[j * s] = float(grad) + (accumulate ? db[j * s] : 0.f);
      }
  }
}

}  // namespace

void launch_pointwise_loss(int kind, const float* pred, const float* target, int64_t n, int64_t k,
                           double delta, const float* pos_weight, double g, float* dpred,
                           bool accumulate, double* loss, cudaStream_t s) {
  if (n == 0) return;
  pointwise_loss_kernel<<<blocks_for(n), kThreads, 0, s>>>(
      kind, pred, target, n, k, delta, pos_weight, g, dpred, accumulate ? 1 : 0, loss);
  CUDA_CHECK_LAUNCH();
}

void launch_pixel_count(const int32_t* labels, int64_t n, int32_t ignore_index, int64_t c,
                        unsigned long long* counted, int32_t* bad, cudaStream_t s) {
  if (n == 0) return;
  pixel_count_kernel<<<blocks_for(n), kThreads, 0, s>>>(labels, n, ignore_index, c, counted, bad);
  CUDA_CHECK_LAUNCH();
}

void launch_pixel_xent(const float* logits, const int32_t* labels, int64_t n, int64_t c, int64_t s,
                       int32_t ignore_index, double g, float* dlogits, bool accumulate,
                       double* loss, int32_t* correct, cudaStream_t st) {
  if (n * s == 0) return;
  pixel_xent_kernel<<<blocks_for(n * s), kThreads, 0, st>>>(
      logits, labels, n, c, s, ignore_index, g, dlogits, accumulate ? 1 : 0, loss, correct);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ringtrain::kernels::cuda
