// CPU losses beyond classification (the model file's `loss` block, nn/loss.hpp): the
// elementwise regression and multi-label losses, and cross-entropy per position of dense
// labels (segmentation). Each element's loss is computed in double and summed over fixed
// chunks in order, so the sum does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/cpu_backend.hpp"

namespace ringtrain::kernels::cpu {

namespace {

constexpr int64_t kLossChunk = 1 << 14;

// log(1 + exp(x)) without overflow.
inline double softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); }

// The loss of one element and its derivative by the prediction.
inline double element_loss(PointwiseLoss kind, double p, double t, double delta, double pw,
                           double* grad) {
  const double d = p - t;
  switch (kind) {
    case PointwiseLoss::mse:
      *grad = 2 * d;
      return d * d;
    case PointwiseLoss::l1:
      *grad = d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0;
      return std::fabs(d);
    case PointwiseLoss::huber:
      if (std::fabs(d) < delta) {
        *grad = d;
        return 0.5 * d * d;
      }
      *grad = d > 0 ? delta : -delta;
      return delta * (std::fabs(d) - 0.5 * delta);
    case PointwiseLoss::bce_logits: {
      // -(pw t log sigmoid(p) + (1 - t) log(1 - sigmoid(p)))
      const double sig = 1.0 / (1.0 + std::exp(-p));
      *grad = sig * (pw * t + 1 - t) - pw * t;
      return pw * t * softplus(-p) + (1 - t) * softplus(p);
    }
  }
  return 0;
}

}  // namespace

double CpuBackend::do_pointwise_loss(PointwiseLoss kind, const Tensor& pred, const Tensor& target,
                                     float delta, const Tensor* pos_weight, float grad_scale,
                                     const Tensor* dpred, bool accumulate) {
  const int64_t n = pred.numel(), k = pred.shape.back();
  const float* p = pred.as<float>();
  const float* t = target.as<float>();
  const float* pw = pos_weight ? pos_weight->as<float>() : nullptr;
  float* d = dpred ? dpred->as<float>() : nullptr;
  const double g = double(grad_scale) / double(n);
  const int64_t chunks = (n + kLossChunk - 1) / kLossChunk;
  std::vector<double> part(size_t(chunks), 0.0);
#pragma omp parallel for num_threads(threads_) if (n >= 2 * kLossChunk)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0;
    for (int64_t i = c * kLossChunk; i < std::min(n, (c + 1) * kLossChunk); ++i) {
      double grad = 0;
      s += element_loss(kind, double(p[i]), double(t[i]), double(delta),
                        pw ? double(pw[i % k]) : 1.0, &grad);
      if (d) d[i] = float(grad * g) + (accumulate ? d[i] : 0.f);
    }
    part[size_t(c)] = s;
  }
  double s = 0;
  for (double v : part) s += v;
  return s;
}

PixelXentResult CpuBackend::do_pixel_xent(const Tensor& logits, const Tensor& labels,
                                          int32_t ignore_index, float grad_scale,
                                          const Tensor* dlogits, bool accumulate) {
  const int64_t n = logits.dim(0), c = logits.dim(1), s = logits.numel() / (n * c);
  const float* pl = logits.as<float>();
  const int32_t* py = labels.as<int32_t>();
  float* pd = dlogits ? dlogits->as<float>() : nullptr;
  PixelXentResult res;
  for (int64_t i = 0; i < n * s; ++i) {
    if (py[i] == ignore_index) continue;
    RT_CHECK(py[i] >= 0 && py[i] < c, "label ", py[i], " at position ", i % s, " of sample ", i / s,
             " is outside [0, ", c, ") and is not the ignore_index ", ignore_index);
    ++res.counted;
  }
  // PyTorch's mean over the counted positions (none counted: loss 0, no gradient).
  const double g = res.counted ? double(grad_scale) / double(res.counted) : 0.0;
  std::vector<double> row_loss(size_t(n), 0.0);
  std::vector<int64_t> row_correct(size_t(n), 0);
#pragma omp parallel for num_threads(threads_) if (n * s * c >= (1 << 16))
  for (int64_t b = 0; b < n; ++b) {
    const float* x = pl + b * c * s;
    float* dx = pd ? pd + b * c * s : nullptr;
    double loss = 0;
    int64_t correct = 0;
    for (int64_t q = 0; q < s; ++q) {
      const int32_t label = py[b * s + q];
      if (label == ignore_index) {
        if (dx && !accumulate)
          for (int64_t j = 0; j < c; ++j) dx[j * s + q] = 0.f;
        continue;
      }
      int64_t arg = 0;
      for (int64_t j = 1; j < c; ++j)
        if (x[j * s + q] > x[arg * s + q]) arg = j;
      const double mx = x[arg * s + q];
      double sum = 0;
      for (int64_t j = 0; j < c; ++j) sum += std::exp(double(x[j * s + q]) - mx);
      const double lse = mx + std::log(sum);
      loss += lse - double(x[label * s + q]);
      correct += arg == label;
      if (dx)
        for (int64_t j = 0; j < c; ++j) {
          const double grad = (std::exp(double(x[j * s + q]) - lse) - (j == label ? 1.0 : 0.0)) * g;
          dx[j * s + q] = float(grad) + (accumulate ? dx[j * s + q] : 0.f);
        }
    }
    row_loss[size_t(b)] = loss;
    row_correct[size_t(b)] = correct;
  }
  for (int64_t b = 0; b < n; ++b) {
    res.loss_sum += row_loss[size_t(b)];
    res.correct += row_correct[size_t(b)];
  }
  return res;
}

RT_KERNEL_FAMILY(cpu, loss) {
  table.declare(op_name(Op::pointwise_loss), {DType::f32});
  table.declare(op_name(Op::pixel_xent), {DType::f32});
}

}  // namespace ringtrain::kernels::cpu
