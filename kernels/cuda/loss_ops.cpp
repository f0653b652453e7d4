// CudaBackend's loss family: the kernels of loss.cu write each element's (position's) loss in
// double to scratch; the host reads them back and sums them in the CPU backend's order
// (kernels/cpu/cpu_loss.cpp), so the two backends differ only by their exp/log rounding.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/families.hpp"
#include "kernels/cuda/launch.hpp"

namespace ringtrain::kernels::cuda {

namespace {
constexpr int64_t kLossChunk = 1 << 14;  // as the CPU backend's
}

double CudaBackend::do_pointwise_loss(PointwiseLoss kind, const Tensor& pred, const Tensor& target,
                                      float delta, const Tensor* pos_weight, float grad_scale,
                                      const Tensor* dpred, bool accumulate) {
  const int64_t n = pred.numel();
  auto* loss = static_cast<double*>(scratch(kReduce, size_t(n) * 8));
  launch_pointwise_loss(int(kind), pred.as<float>(), target.as<float>(), n, pred.shape.back(),
                        double(delta), pos_weight ? pos_weight->as<float>() : nullptr,
                        double(grad_scale) / double(n), dpred ? dpred->as<float>() : nullptr,
                        accumulate, loss, stream());
  std::vector<double> host(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpyAsync(host.data(), loss, size_t(n) * 8, cudaMemcpyDeviceToHost, stream()));
  wait();
  double s = 0;
  for (int64_t c = 0; c < n; c += kLossChunk) {
    double part = 0;
    for (int64_t i = c; i < std::min(n, c + kLossChunk); ++i) part += host[size_t(i)];
    s += part;
  }
  return s;
}

PixelXentResult CudaBackend::do_pixel_xent(const Tensor& logits, const Tensor& labels,
                                           int32_t ignore_index, float grad_scale,
                                           const Tensor* dlogits, bool accumulate) {
  const int64_t n = logits.dim(0), c = logits.dim(1), s = logits.numel() / (n * c);
  const int64_t m = n * s;
  char* dev = static_cast<char*>(scratch(kReduce, size_t(m) * 12 + 16));
  auto* loss = reinterpret_cast<double*>(dev);
  auto* correct = reinterpret_cast<int32_t*>(dev + size_t(m) * 8);
  auto* counted = reinterpret_cast<unsigned long long*>(dev + size_t(m) * 12 + (m % 2 ? 4 : 0));
  auto* bad = reinterpret_cast<int32_t*>(reinterpret_cast<char*>(counted) + 8);
  CUDA_CHECK(cudaMemsetAsync(counted, 0, 12, stream()));
  launch_pixel_count(labels.as<int32_t>(), m, ignore_index, c, counted, bad, stream());
  unsigned long long count = 0;
  int32_t bad_label = 0;
  CUDA_CHECK(cudaMemcpyAsync(&count, counted, 8, cudaMemcpyDeviceToHost, stream()));
  CUDA_CHECK(cudaMemcpyAsync(&bad_label, bad, 4, cudaMemcpyDeviceToHost, stream()));
  wait();
  RT_CHECK(bad_label == 0, "a label outside [0, ", c, ") that is not the ignore_index ",
           ignore_index, " in ", m, " positions");
  const double g = count ? double(grad_scale) / double(count) : 0.0;
  launch_pixel_xent(logits.as<float>(), labels.as<int32_t>(), n, c, s, ignore_index, g,
                    dlogits ? dlogits->as<float>() : nullptr, accumulate, loss, correct, stream());
  std::vector<char> host(size_t(m) * 12);
  CUDA_CHECK(cudaMemcpyAsync(host.data(), dev, host.size(), cudaMemcpyDeviceToHost, stream()));
  wait();
  PixelXentResult res;
  res.counted = int64_t(count);
  for (int64_t b = 0; b < n; ++b) {  // per sample, then over samples: the CPU's order
    double row = 0;
    for (int64_t q = 0; q < s; ++q) {
      double l = 0;
      int32_t ok = 0;
      std::memcpy(&l, host.data() + size_t(b * s + q) * 8, 8);
      std::memcpy(&ok, host.data() + size_t(m) * 8 + size_t(b * s + q) * 4, 4);
      row += l;
      res.correct += ok;
    }
    res.loss_sum += row;
  }
  return res;
}

RT_KERNEL_FAMILY(cuda, loss) {
  table.declare(op_name(Op::pointwise_loss), {DType::f32});
  table.declare(op_name(Op::pixel_xent), {DType::f32});
}

}  // namespace ringtrain::kernels::cuda
