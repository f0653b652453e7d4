// CudaBackend (see cuda_backend.hpp): validation and dispatch of the elementwise, reduction,
// optimizer, pooling and normalisation ops to our kernels; make_cuda_backend(). GEMM is in
// gemm.cpp, convolution in conv.cpp.
#include "kernels/cuda/cuda_backend.hpp"

#include <cmath>
#include <vector>

#include "kernels/cuda/families.hpp"
#include "kernels/cuda/launch.hpp"

namespace ringtrain::kernels::cuda {

std::unique_ptr<Backend> make_cuda_backend(int index, const MemoryPolicy& policy) {
  return std::make_unique<CudaBackend>(runtime(index, &policy));
}

CudaBackend::CudaBackend(DeviceRuntime& rt) : rt_(rt) {}
CudaBackend::~CudaBackend() = default;

bool CudaBackend::capable(std::string_view op, DType dtype) const {
  const bool tensor_core_op = op == op_name(Op::gemm) || op == op_name(Op::conv2d);
  // Tensor-core fp16 needs compute capability 7.0, bf16 8.0 (cuBLAS and cuDNN refuse below).
  const int cc = rt_.info().cc_major * 10 + rt_.info().cc_minor;
  if (dtype == DType::f16 && cc < 70 && tensor_core_op) return false;
  if (dtype == DType::bf16 && cc < 80 && tensor_core_op) return false;
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
    b = Buffer(bytes + bytes / 4, device(), MemCategory::workspace);  // whoever asks
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

void CudaBackend::do_cast(const Tensor& src, const Tensor& dst) {
  if (src.dtype == dst.dtype) {
    if (src.data != dst.data)
      CUDA_CHECK(
          cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, stream()));
    return;
  }
  launch_cast(src.data, src.dtype, dst.data, dst.dtype, src.numel(), stream());
}

void CudaBackend::do_bias_add(const Tensor& y, const Tensor& bias, Activation act) {
  const int64_t rows = y.dim(0), f = y.numel() / rows;
  launch_bias_act(y.data, y.dtype, bias.data, bias.dtype, rows, f, 1,
                  act == Activation::relu ? 1 : 0, stream());
}

void CudaBackend::do_bias_grad(const Tensor& dy, const Tensor& db) {
  const int64_t rows = dy.dim(0), f = dy.numel() / rows;
  auto* partial = static_cast<float*>(scratch(kReduce, size_t(kBiasGradSlices * f) * 4));
  launch_bias_grad(dy.data, dy.dtype, rows, f, 1, partial, db.data, db.dtype, stream());
}

void CudaBackend::do_relu(const Tensor& x, const Tensor& y) {
  launch_relu(x.data, y.data, x.dtype, x.numel(), stream());
}

void CudaBackend::do_relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  launch_relu_backward(y.data, y.dtype, dy.data, dx.data, dx.dtype, y.numel(), stream());
}

XentResult CudaBackend::do_softmax_xent(const Tensor& logits, const Tensor& labels,
                                        float grad_scale, const Tensor* dlogits,
                                        float label_smoothing) {
  const int64_t rows = logits.dim(0), c = logits.dim(1);
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

bool CudaBackend::do_unscale_check(const Tensor& in, float factor, const Tensor& out) {
  auto* flag = static_cast<int32_t*>(scratch(kReduce, 4));
  CUDA_CHECK(cudaMemsetAsync(flag, 0, 4, stream()));
  launch_unscale_check(in.data, in.dtype, factor, out.as<float>(), in.numel(), flag, stream());
  auto* host = static_cast<int32_t*>(rt_.pinned());
  CUDA_CHECK(cudaMemcpyAsync(host, flag, 4, cudaMemcpyDeviceToHost, stream()));
  wait();
  return *host != 0;
}

bool CudaBackend::do_any_nonfinite(const Tensor& x) {
  auto* flag = static_cast<int32_t*>(scratch(kReduce, 4));
  CUDA_CHECK(cudaMemsetAsync(flag, 0, 4, stream()));
  launch_unscale_check(x.data, x.dtype, 1.f, nullptr, x.numel(), flag, stream());
  auto* host = static_cast<int32_t*>(rt_.pinned());
  CUDA_CHECK(cudaMemcpyAsync(host, flag, 4, cudaMemcpyDeviceToHost, stream()));
  wait();
  return *host != 0;
}

double CudaBackend::do_sum_squares(const Tensor& x) {
  auto* partial = static_cast<double*>(scratch(kReduce, (kSumSlices + 1) * 8));
  launch_sum_squares(x.as<float>(), x.numel(), partial, partial + kSumSlices, stream());
  auto* host = static_cast<double*>(rt_.pinned());
  CUDA_CHECK(cudaMemcpyAsync(host, partial + kSumSlices, 8, cudaMemcpyDeviceToHost, stream()));
  wait();
  return *host;
}

void CudaBackend::do_scale(const Tensor& x, float factor) {
  launch_scale(x.as<float>(), x.numel(), factor, stream());
}

void CudaBackend::do_sgd_step(const SgdConfig& cfg, const Tensor& param, const Tensor& grad,
                              const Tensor* momentum, const Tensor* work) {
  const int64_t n = param.numel();
  launch_sgd(param.as<float>(), grad.as<float>(), momentum ? momentum->as<float>() : nullptr, n,
             cfg.lr, cfg.momentum, cfg.weight_decay, cfg.nesterov, work ? work->data : nullptr,
             work ? work->dtype : DType::f32, stream());
}

void CudaBackend::do_adamw_step(const AdamWConfig& cfg, const Tensor& param, const Tensor& grad,
                                const Tensor& exp_avg, const Tensor& exp_avg_sq,
                                const Tensor* work) {
  const int64_t n = param.numel();
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

void CudaBackend::do_maxpool2d_forward(const PoolShape& ps, const Tensor& x, const Tensor& y,
                                       const Tensor& argmax) {
  const int64_t P = ps.p(), Q = ps.q(), planes = ps.n * ps.c;
  launch_maxpool_fwd(x.data, y.data, argmax.as<int32_t>(), x.dtype, planes, ps.h, ps.w, P, Q,
                     ps.kernel, ps.stride, ps.relu_input, stream());
}

void CudaBackend::do_maxpool2d_backward(const PoolShape& ps, const Tensor& dy, const Tensor& argmax,
                                        const Tensor& dx) {
  const int64_t P = ps.p(), Q = ps.q(), planes = ps.n * ps.c;
  launch_maxpool_bwd(dy.data, argmax.as<int32_t>(), dx.data, dy.dtype, planes, ps.h, ps.w, P, Q,
                     ps.kernel, ps.stride, stream());
}

void CudaBackend::do_avgpool_global_forward(const Tensor& x, const Tensor& y) {
  launch_avgpool_fwd(x.data, y.data, x.dtype, y.dtype, x.dim(0) * x.dim(1), x.dim(2) * x.dim(3),
                     stream());
}

void CudaBackend::do_avgpool_global_backward(const Tensor& dy, const Tensor& dx) {
  launch_avgpool_bwd(dy.data, dy.dtype, dx.data, dx.dtype, dx.dim(0) * dx.dim(1),
                     dx.dim(2) * dx.dim(3), stream());
}

void CudaBackend::do_batchnorm_forward(const BatchNormConfig& cfg, bool training, const Tensor& x,
                                       const Tensor& gamma, const Tensor& beta,
                                       const Tensor& running_mean, const Tensor& running_var,
                                       const Tensor& y, const Tensor& mean, const Tensor& invstd) {
  const NchwDims d = batchnorm_dims(x, gamma);
  launch_bn_forward(x.data, x.dtype, y.data, y.dtype, d.n, d.c, d.hw, gamma.as<float>(),
                    beta.as<float>(), running_mean.as<float>(), running_var.as<float>(),
                    mean.as<float>(), invstd.as<float>(), training, cfg.momentum, cfg.eps,
                    stream());
}

void CudaBackend::do_batchnorm_backward(bool training, const Tensor& x, const Tensor& dy,
                                        const Tensor& gamma, const Tensor& mean,
                                        const Tensor& invstd, const Tensor& dx,
                                        const Tensor& dgamma, const Tensor& dbeta) {
  const NchwDims d = batchnorm_dims(x, gamma);
  launch_bn_backward(x.data, dy.data, dx.data, x.dtype, dy.dtype, dx.dtype, d.n, d.c, d.hw,
                     gamma.as<float>(), mean.as<float>(), invstd.as<float>(), dgamma.as<float>(),
                     dbeta.as<float>(), training, stream());
}

void CudaBackend::do_dropout_forward(const Tensor& x, float p, uint64_t seed, const Tensor& y,
                                     const Tensor& mask) {
  launch_dropout_fwd(x.data, y.data, mask.as<uint8_t>(), x.dtype, x.numel(), p, seed, stream());
}

void CudaBackend::do_dropout_backward(const Tensor& dy, const Tensor& mask, float p,
                                      const Tensor& dx) {
  launch_dropout_bwd(dy.data, mask.as<uint8_t>(), dx.data, dy.dtype, dy.numel(), p, stream());
}

void CudaBackend::do_add(const Tensor& a, const Tensor& b, const Tensor& y) {
  launch_add(a.data, a.dtype, b.data, b.dtype, y.data, y.dtype, a.numel(), stream());
}

// Everything but the activations (activation.cu): the ops of cuda_backend.cpp, gemm.cpp,
// conv.cpp and transformer_ops.cpp, whose kernels are this backend's do_<op> methods. No
// fused_unscale: the optimizer kernels read fp32 gradients as they are.
RT_KERNEL_FAMILY(cuda, core) {
  for (Op op : {Op::gemm, Op::cast, Op::bias_add, Op::bias_grad, Op::relu, Op::relu_backward,
                Op::unscale_check, Op::any_nonfinite, Op::conv2d, Op::maxpool2d, Op::avgpool_global,
                Op::batchnorm, Op::dropout, Op::add, Op::embedding, Op::layernorm, Op::attention})
    table.declare(op_name(op), kFloatDTypes);
  for (Op op :
       {Op::softmax_xent, Op::sum_squares, Op::scale, Op::sgd_step, Op::adamw_step, Op::token_xent})
    table.declare(op_name(op), {DType::f32});
}

#define RT_DECLARE_FAMILY(f) RT_KERNEL_FAMILY(cuda, f);
RT_CUDA_KERNEL_FAMILIES(RT_DECLARE_FAMILY)
#undef RT_DECLARE_FAMILY

const KernelTable& CudaBackend::kernel_table() const {
  static const KernelTable table = [] {
    KernelTable t;
#define RT_REGISTER_FAMILY(f) rt_kernel_family_cuda_##f(t);
    RT_CUDA_KERNEL_FAMILIES(RT_REGISTER_FAMILY)
#undef RT_REGISTER_FAMILY
    return t;
  }();
  return table;
}

}  // namespace ringtrain::kernels::cuda
