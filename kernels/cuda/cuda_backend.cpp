// CudaBackend (see cuda_backend.hpp): validation and dispatch of the elementwise, reduction,
// optimizer, pooling and normalisation ops to our kernels; make_cuda_backend(). GEMM is in
// gemm.cpp, convolution in conv.cpp.
#include "kernels/cuda/cuda_backend.hpp"

#include <cmath>
#include <vector>

#include "kernels/cuda/launch.hpp"

namespace ringtrain::kernels::cuda {

std::unique_ptr<Backend> make_cuda_backend(int index, const MemoryPolicy& policy) {
  return std::make_unique<CudaBackend>(runtime(index, &policy));
}

CudaBackend::CudaBackend(DeviceRuntime& rt) : rt_(rt) {}
CudaBackend::~CudaBackend() = default;

bool CudaBackend::supports(Op op, DType dtype) const {
  if (!is_float(dtype) || dtype == DType::f64) return false;
  if (op == Op::fused_unscale) return false;  // the optimizer kernels read fp32 gradients as is
  // Tensor-core fp16 needs compute capability 7.0, bf16 8.0 (cuBLAS and cuDNN refuse below).
  const int cc = rt_.info().cc_major * 10 + rt_.info().cc_minor;
  if (dtype == DType::f16 && cc < 70 && (op == Op::gemm || op == Op::conv2d)) return false;
  if (dtype == DType::bf16 && cc < 80 && (op == Op::gemm || op == Op::conv2d)) return false;
  return true;
}

void CudaBackend::check_device(const Tensor& t, const char* what) const {
  if (t.device.kind == Device::cuda && t.device.index == rt_.index()) return;
  // A view made without naming its device (Tensor's default label is cpu) over memory of
  // this device is accepted: core's flat-buffer views do not all carry the label.
  if (t.device.kind == Device::cpu && t.data) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, t.data) == cudaSuccess &&
        (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) &&
        attr.device == rt_.index())
      return;
    (void)cudaGetLastError();
  }
  RT_CHECK(false, "the cuda:", rt_.index(), " backend got ", what, " in ",
           t.device.kind == Device::cpu ? std::string("host memory") : cat("cuda:", t.device.index),
           " (shape ", shape_str(t.shape), "); tensors must be on the backend's device");
}

void* CudaBackend::scratch(Slot slot, size_t bytes) {
  Buffer& b = scratch_[slot];
  if (b.bytes() < bytes) {
    b = Buffer();  // free first: the cache can hand the block straight back, larger
    AllocScope scope(slot == kWorkspace ? "cuda workspace" : "cuda scratch");
    b = Buffer(bytes + bytes / 4, device());
  }
  return b.data();
}

Tensor CudaBackend::as_dtype(const Tensor& t, DType want, Slot slot) {
  if (t.dtype == want) return t;
  Tensor out(scratch(slot, size_t(t.numel()) * dtype_size(want)), t.shape, want, device());
  launch_cast(t.data, t.dtype, out.data, want, t.numel(), stream());
  return out;
}

void CudaBackend::wait() { CUDA_CHECK(cudaStreamSynchronize(stream())); }

void CudaBackend::cast(const Tensor& src, const Tensor& dst) {
  RT_CHECK(src.numel() == dst.numel(), "cast of ", src.numel(), " elements into ", dst.numel());
  check_device(src, "cast source");
  check_device(dst, "cast destination");
  if (src.dtype == dst.dtype) {
    if (src.data != dst.data)
      CUDA_CHECK(
          cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, stream()));
    return;
  }
  launch_cast(src.data, src.dtype, dst.data, dst.dtype, src.numel(), stream());
}

void CudaBackend::bias_add(const Tensor& y, const Tensor& bias, Activation act) {
  check_device(y, "bias_add output");
  check_device(bias, "bias");
  const int64_t rows = y.dim(0), f = y.numel() / rows;
  RT_CHECK(bias.numel() == f, "bias of ", bias.numel(), " for rows of ", f);
  launch_bias_act(y.data, y.dtype, bias.data, bias.dtype, rows, f, 1,
                  act == Activation::relu ? 1 : 0, stream());
}

void CudaBackend::bias_grad(const Tensor& dy, const Tensor& db) {
  check_device(dy, "bias_grad input");
  check_device(db, "bias gradient");
  const int64_t rows = dy.dim(0), f = dy.numel() / rows;
  RT_CHECK(db.numel() == f, "bias gradient of ", db.numel(), " for rows of ", f);
  auto* partial = static_cast<float*>(scratch(kReduce, size_t(kBiasGradSlices * f) * 4));
  launch_bias_grad(dy.data, dy.dtype, rows, f, 1, partial, db.data, db.dtype, stream());
}

void CudaBackend::relu(const Tensor& x, const Tensor& y) {
  RT_CHECK(x.numel() == y.numel() && x.dtype == y.dtype, "relu shapes/dtypes differ");
  check_device(x, "relu input");
  check_device(y, "relu output");
  launch_relu(x.data, y.data, x.dtype, x.numel(), stream());
}

void CudaBackend::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  RT_CHECK(y.numel() == dy.numel() && dy.numel() == dx.numel() && dy.dtype == dx.dtype,
           "relu_backward shapes/dtypes differ");
  check_device(y, "relu output");
  check_device(dy, "relu gradient");
  check_device(dx, "relu input gradient");
  launch_relu_backward(y.data, y.dtype, dy.data, dx.data, dx.dtype, y.numel(), stream());
}

XentResult CudaBackend::softmax_xent(const Tensor& logits, const Tensor& labels, float grad_scale,
                                     const Tensor* dlogits, float label_smoothing) {
  RT_CHECK(logits.dtype == DType::f32 && labels.dtype == DType::i32,
           "softmax_xent takes fp32 logits and int32 labels");
  check_device(logits, "logits");
  check_device(labels, "labels");
  if (dlogits) check_device(*dlogits, "logit gradients");
  const int64_t rows = logits.dim(0), c = logits.dim(1);
  RT_CHECK(labels.numel() == rows, "labels ", labels.numel(), " for ", rows, " rows");
  // Device: per-row loss (double) and correct flag, and the bad-label flag.
  const size_t need = size_t(rows) * 12 + 16;
  char* dev = static_cast<char*>(scratch(kReduce, need));
  auto* row_loss = reinterpret_cast<double*>(dev);
  auto* row_correct = reinterpret_cast<int32_t*>(dev + size_t(rows) * 8);
  auto* bad = reinterpret_cast<int32_t*>(dev + size_t(rows) * 12);
  CUDA_CHECK(cudaMemsetAsync(bad, 0, 4, stream()));
  launch_softmax_xent(logits.as<float>(), labels.as<int32_t>(), rows, c, grad_scale / float(rows),
                      label_smoothing, dlogits ? dlogits->as<float>() : nullptr, row_loss,
                      row_correct, bad, stream());
  // Read back and summed on the host in row order, as the CPU backend sums.
  std::vector<char> host(need);
  char* dst = need <= DeviceRuntime::kPinnedBytes ? static_cast<char*>(rt_.pinned()) : host.data();
  CUDA_CHECK(cudaMemcpyAsync(dst, dev, need, cudaMemcpyDeviceToHost, stream()));
  wait();
  int32_t bad_label = 0;
  std::memcpy(&bad_label, dst + size_t(rows) * 12, 4);
  RT_CHECK(bad_label == 0, "a label outside [0, ", c, ") in a batch of ", rows);
  XentResult res;
  for (int64_t r = 0; r < rows; ++r) {
    double l = 0;
    int32_t ok = 0;
    std::memcpy(&l, dst + size_t(r) * 8, 8);
    std::memcpy(&ok, dst + size_t(rows) * 8 + size_t(r) * 4, 4);
    res.loss_sum += l;
    res.correct += ok;
  }
  return res;
}

bool CudaBackend::unscale_check(const Tensor& in, float factor, const Tensor& out) {
  RT_CHECK(out.dtype == DType::f32 && in.numel() == out.numel(), "unscale_check into ",
           dtype_name(out.dtype), " of ", out.numel(), " from ", in.numel());
  check_device(in, "unscale input");
  check_device(out, "unscale output");
  auto* flag = static_cast<int32_t*>(scratch(kReduce, 4));
  CUDA_CHECK(cudaMemsetAsync(flag, 0, 4, stream()));
  launch_unscale_check(in.data, in.dtype, factor, out.as<float>(), in.numel(), flag, stream());
  auto* host = static_cast<int32_t*>(rt_.pinned());
  CUDA_CHECK(cudaMemcpyAsync(host, flag, 4, cudaMemcpyDeviceToHost, stream()));
  wait();
  return *host != 0;
}

bool CudaBackend::any_nonfinite(const Tensor& x) {
  check_device(x, "checked tensor");
  auto* flag = static_cast<int32_t*>(scratch(kReduce, 4));
  CUDA_CHECK(cudaMemsetAsync(flag, 0, 4, stream()));
  launch_unscale_check(x.data, x.dtype, 1.f, nullptr, x.numel(), flag, stream());
  auto* host = static_cast<int32_t*>(rt_.pinned());
  CUDA_CHECK(cudaMemcpyAsync(host, flag, 4, cudaMemcpyDeviceToHost, stream()));
  wait();
  return *host != 0;
}

double CudaBackend::sum_squares(const Tensor& x) {
  RT_CHECK(x.dtype == DType::f32, "sum_squares takes fp32");
  check_device(x, "sum_squares input");
  auto* partial = static_cast<double*>(scratch(kReduce, (kSumSlices + 1) * 8));
  launch_sum_squares(x.as<float>(), x.numel(), partial, partial + kSumSlices, stream());
  auto* host = static_cast<double*>(rt_.pinned());
  CUDA_CHECK(cudaMemcpyAsync(host, partial + kSumSlices, 8, cudaMemcpyDeviceToHost, stream()));
  wait();
  return *host;
}

void CudaBackend::scale(const Tensor& x, float factor) {
  RT_CHECK(x.dtype == DType::f32, "scale takes fp32");
  check_device(x, "scaled tensor");
  launch_scale(x.as<float>(), x.numel(), factor, stream());
}

void CudaBackend::sgd_step(const SgdConfig& cfg, const Tensor& param, const Tensor& grad,
                           const Tensor* momentum, const Tensor* work) {
  const int64_t n = param.numel();
  RT_CHECK(
      grad.numel() == n && (!momentum || momentum->numel() == n) && (!work || work->numel() == n),
      "sgd_step buffers differ in size");
  RT_CHECK(param.dtype == DType::f32 && grad.dtype == DType::f32, "sgd_step takes fp32");
  check_device(param, "parameters");
  check_device(grad, "gradients");
  if (momentum) check_device(*momentum, "momentum");
  if (work) check_device(*work, "working copy");
  launch_sgd(param.as<float>(), grad.as<float>(), momentum ? momentum->as<float>() : nullptr, n,
             cfg.lr, cfg.momentum, cfg.weight_decay, cfg.nesterov, work ? work->data : nullptr,
             work ? work->dtype : DType::f32, stream());
}

void CudaBackend::adamw_step(const AdamWConfig& cfg, const Tensor& param, const Tensor& grad,
                             const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* work) {
  const int64_t n = param.numel();
  RT_CHECK(grad.numel() == n && exp_avg.numel() == n && exp_avg_sq.numel() == n &&
               (!work || work->numel() == n),
           "adamw_step buffers differ in size");
  for (const Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq}) check_device(*t, "adamw buffer");
  if (work) check_device(*work, "working copy");
  // The scalars exactly as the CPU backend computes them.
  const float b1 = cfg.beta1, b2 = cfg.beta2;
  const float bc1 = 1.f - float(std::pow(double(b1), double(cfg.step)));
  const float bc2 = 1.f - float(std::pow(double(b2), double(cfg.step)));
  const float step_size = cfg.lr / bc1;
  const float bc2_sqrt = std::sqrt(bc2);
  const float decay = 1.f - cfg.lr * cfg.weight_decay;
  launch_adamw(param.as<float>(), grad.as<float>(), exp_avg.as<float>(), exp_avg_sq.as<float>(), n,
               b1, b2, cfg.eps, step_size, bc2_sqrt, decay, work ? work->data : nullptr,
               work ? work->dtype : DType::f32, stream());
}

// ---- pooling, normalisation, GELU, dropout, add -------------------------------------

void CudaBackend::maxpool2d_forward(const PoolShape& ps, const Tensor& x, const Tensor& y,
                                    const Tensor& argmax) {
  const int64_t P = ps.p(), Q = ps.q(), planes = ps.n * ps.c;
  check_pool_shapes(ps, x, y, argmax);
  check_device(x, "max pool input");
  check_device(y, "max pool output");
  check_device(argmax, "max pool argmax");
  launch_maxpool_fwd(x.data, y.data, argmax.as<int32_t>(), x.dtype, planes, ps.h, ps.w, P, Q,
                     ps.kernel, ps.stride, ps.relu_input, stream());
}

void CudaBackend::maxpool2d_backward(const PoolShape& ps, const Tensor& dy, const Tensor& argmax,
                                     const Tensor& dx) {
  const int64_t P = ps.p(), Q = ps.q(), planes = ps.n * ps.c;
  RT_CHECK(dy.numel() == planes * P * Q && argmax.numel() == dy.numel() &&
               dx.numel() == planes * ps.h * ps.w && dy.dtype == dx.dtype,
           "max pooling gradient shapes do not match: dy ", shape_str(dy.shape), " dx ",
           shape_str(dx.shape));
  check_device(dy, "max pool gradient");
  check_device(argmax, "max pool argmax");
  check_device(dx, "max pool input gradient");
  launch_maxpool_bwd(dy.data, argmax.as<int32_t>(), dx.data, dy.dtype, planes, ps.h, ps.w, P, Q,
                     ps.kernel, ps.stride, stream());
}

void CudaBackend::avgpool_global_forward(const Tensor& x, const Tensor& y) {
  RT_CHECK(x.shape.size() == 4 && y.numel() == x.dim(0) * x.dim(1),
           "global average pooling takes [N, C, H, W] into [N, C], got ", shape_str(x.shape),
           " into ", shape_str(y.shape));
  check_device(x, "average pool input");
  check_device(y, "average pool output");
  launch_avgpool_fwd(x.data, y.data, x.dtype, y.dtype, x.dim(0) * x.dim(1), x.dim(2) * x.dim(3),
                     stream());
}

void CudaBackend::avgpool_global_backward(const Tensor& dy, const Tensor& dx) {
  RT_CHECK(dx.shape.size() == 4 && dy.numel() == dx.dim(0) * dx.dim(1),
           "global average pooling gradient of ", shape_str(dy.shape), " into ",
           shape_str(dx.shape));
  check_device(dy, "average pool gradient");
  check_device(dx, "average pool input gradient");
  launch_avgpool_bwd(dy.data, dy.dtype, dx.data, dx.dtype, dx.dim(0) * dx.dim(1),
                     dx.dim(2) * dx.dim(3), stream());
}

void CudaBackend::batchnorm_forward(const BatchNormConfig& cfg, bool training, const Tensor& x,
                                    const Tensor& gamma, const Tensor& beta,
                                    const Tensor& running_mean, const Tensor& running_var,
                                    const Tensor& y, const Tensor& mean, const Tensor& invstd) {
  const NchwDims d = batchnorm_dims(x, gamma);
  RT_CHECK(y.numel() == x.numel() && beta.numel() == d.c && running_mean.numel() == d.c &&
               running_var.numel() == d.c && mean.numel() == d.c && invstd.numel() == d.c,
           "batch norm tensors do not match ", d.c, " channels");
  for (const Tensor* t : {&x, &gamma, &beta, &running_mean, &running_var, &y, &mean, &invstd})
    check_device(*t, "batch norm tensor");
  launch_bn_forward(x.data, x.dtype, y.data, y.dtype, d.n, d.c, d.hw, gamma.as<float>(),
                    beta.as<float>(), running_mean.as<float>(), running_var.as<float>(),
                    mean.as<float>(), invstd.as<float>(), training, cfg.momentum, cfg.eps,
                    stream());
}

void CudaBackend::batchnorm_backward(bool training, const Tensor& x, const Tensor& dy,
                                     const Tensor& gamma, const Tensor& mean, const Tensor& invstd,
                                     const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  const NchwDims d = batchnorm_dims(x, gamma);
  RT_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && dgamma.numel() == d.c &&
               dbeta.numel() == d.c && dgamma.dtype == DType::f32 && dbeta.dtype == DType::f32,
           "batch norm gradient tensors do not match ", d.c, " channels");
  for (const Tensor* t : {&x, &dy, &gamma, &mean, &invstd, &dx, &dgamma, &dbeta})
    check_device(*t, "batch norm tensor");
  launch_bn_backward(x.data, dy.data, dx.data, x.dtype, dy.dtype, dx.dtype, d.n, d.c, d.hw,
                     gamma.as<float>(), mean.as<float>(), invstd.as<float>(), dgamma.as<float>(),
                     dbeta.as<float>(), training, stream());
}

void CudaBackend::gelu(const Tensor& x, const Tensor& y) {
  RT_CHECK(x.numel() == y.numel(), "gelu of ", x.numel(), " elements into ", y.numel());
  check_device(x, "gelu input");
  check_device(y, "gelu output");
  launch_gelu(x.data, x.dtype, y.data, y.dtype, x.numel(), stream());
}

void CudaBackend::gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  RT_CHECK(x.numel() == dy.numel() && dy.numel() == dx.numel(), "gelu_backward sizes differ");
  check_device(x, "gelu input");
  check_device(dy, "gelu gradient");
  check_device(dx, "gelu input gradient");
  launch_gelu_backward(x.data, x.dtype, dy.data, dy.dtype, dx.data, dx.dtype, x.numel(), stream());
}

void CudaBackend::dropout_forward(const Tensor& x, float p, uint64_t seed, const Tensor& y,
                                  const Tensor& mask) {
  RT_CHECK(x.numel() == y.numel() && mask.numel() == x.numel() && mask.dtype == DType::u8 &&
               x.dtype == y.dtype,
           "dropout tensors do not match");
  RT_CHECK(p >= 0.f && p < 1.f, "dropout probability ", p, " outside [0, 1)");
  check_device(x, "dropout input");
  check_device(y, "dropout output");
  check_device(mask, "dropout mask");
  launch_dropout_fwd(x.data, y.data, mask.as<uint8_t>(), x.dtype, x.numel(), p, seed, stream());
}

void CudaBackend::dropout_backward(const Tensor& dy, const Tensor& mask, float p,
                                   const Tensor& dx) {
  RT_CHECK(dy.numel() == dx.numel() && mask.numel() == dy.numel() && dy.dtype == dx.dtype,
           "dropout gradient tensors do not match");
  check_device(dy, "dropout gradient");
  check_device(mask, "dropout mask");
  check_device(dx, "dropout input gradient");
  launch_dropout_bwd(dy.data, mask.as<uint8_t>(), dx.data, dy.dtype, dy.numel(), p, stream());
}

void CudaBackend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
  RT_CHECK(a.numel() == b.numel() && b.numel() == y.numel(), "add of ", a.numel(), " and ",
           b.numel(), " elements into ", y.numel());
  check_device(a, "add input");
  check_device(b, "add input");
  check_device(y, "add output");
  launch_add(a.data, a.dtype, b.data, b.dtype, y.data, y.dtype, a.numel(), stream());
}

}  // namespace ringtrain::kernels::cuda
