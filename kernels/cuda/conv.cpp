// CudaBackend convolution through cuDNN (NCHW, cross-correlation, fp32 accumulation):
// forward, backward data, backward filter. Each (shape, dtype) gets a plan: tensor, filter
// and convolution descriptors and, per direction, the first algorithm of cuDNN's heuristic
// that is deterministic and fits the workspace cap (RINGTRAIN_CUDA_CONV_WORKSPACE_MB);
// fp32 is strict (CUDNN_FMA_MATH) unless RINGTRAIN_CUDA_TF32=1. Where cuDNN has no
// algorithm for a 16-bit dtype, the plan runs in fp32 on converted copies. Bias and
// activation are one fused pass of our own after the convolution; the bias gradient is our
// deterministic reduction.
#include <cstdio>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/launch.hpp"

namespace ringtrain::kernels::cuda {

namespace {

cudnnDataType_t dnn_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      break;
  }
  throw_runtime(__FILE__, __LINE__, cat("convolution in ", dtype_name(t), " is not supported"));
}

// The first result that ran, is deterministic, fits the cap and (strict fp32) uses no
// tensor-op math; false when there is none. Strict fp32 then keeps CUDNN_FMA_MATH on the
// descriptor whatever the result says (on Ampere and later CUDNN_DEFAULT_MATH allows TF32).
template <typename Perf>
bool pick(const Perf* perf, int count, bool strict_fp32, size_t cap, Perf& out) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.determinism != CUDNN_DETERMINISTIC || p.memory > cap)
      continue;
    if (strict_fp32 && p.mathType != CUDNN_FMA_MATH && p.mathType != CUDNN_DEFAULT_MATH) continue;
    out = p;
    return true;
  }
  return false;
}

// Descriptors and algorithms for `t`; false (plan left partly built) when cuDNN offers no
// algorithm for some direction in that dtype.
bool build(cudnnHandle_t h, const ConvShape& cs, DType t, size_t cap, ConvPlan& plan) {
  const cudnnDataType_t dt = dnn_type(t);
  plan.dtype = t;
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan.x));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan.y));
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&plan.w));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan.x, CUDNN_TENSOR_NCHW, dt, int(cs.n), int(cs.c),
                                         int(cs.h), int(cs.w)));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan.y, CUDNN_TENSOR_NCHW, dt, int(cs.n), int(cs.k),
                                         int(cs.p()), int(cs.q())));
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan.w, dt, CUDNN_TENSOR_NCHW, int(cs.k), int(cs.c),
                                         int(cs.r), int(cs.s)));
  const bool strict = t == DType::f32 && !cuda_env().tf32;
  const cudnnMathType_t math =
      t == DType::f32 ? (strict ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH) : CUDNN_TENSOR_OP_MATH;
  for (auto* c : {&plan.fwd, &plan.bwd_data, &plan.bwd_filter}) {
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(c));
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(*c, int(cs.pad), int(cs.pad), int(cs.stride),
                                                int(cs.stride), 1, 1, CUDNN_CROSS_CORRELATION,
                                                CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionMathType(*c, math));
  }
  int count = 0;
  {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT], best{};
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
        h, plan.x, plan.w, plan.fwd, plan.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf));
    if (!pick(perf, count, strict, cap, best)) return false;
    plan.fwd_algo = best.algo;
    plan.fwd_ws = best.memory;
    CUDNN_CHECK(cudnnSetConvolutionMathType(plan.fwd, strict ? CUDNN_FMA_MATH : best.mathType));
  }
  {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT], best{};
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, plan.w, plan.y, plan.bwd_data, plan.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count,
        perf));
    if (!pick(perf, count, strict, cap, best)) return false;
    plan.data_algo = best.algo;
    plan.data_ws = best.memory;
    CUDNN_CHECK(
        cudnnSetConvolutionMathType(plan.bwd_data, strict ? CUDNN_FMA_MATH : best.mathType));
  }
  {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT], best{};
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, plan.x, plan.y, plan.bwd_filter, plan.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count,
        perf));
    if (!pick(perf, count, strict, cap, best)) return false;
    plan.filter_algo = best.algo;
    plan.filter_ws = best.memory;
    CUDNN_CHECK(
        cudnnSetConvolutionMathType(plan.bwd_filter, strict ? CUDNN_FMA_MATH : best.mathType));
  }
  return true;
}

}  // namespace

ConvPlan& CudaBackend::conv_plan(const ConvShape& cs, DType t) {
  char key[160];
  std::snprintf(key, sizeof key, "%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%d", (long long)cs.n,
                (long long)cs.c, (long long)cs.h, (long long)cs.w, (long long)cs.k, (long long)cs.r,
                (long long)cs.s, (long long)cs.stride, (long long)cs.pad, int(t));
  auto& slot = conv_plans_[key];
  if (!slot) {
    auto plan = std::make_unique<ConvPlan>();
    const size_t cap = cuda_env().conv_workspace;
    if (!build(rt_.cudnn(), cs, t, cap, *plan)) {
      plan = std::make_unique<ConvPlan>();
      RT_CHECK(t != DType::f32 && build(rt_.cudnn(), cs, DType::f32, cap, *plan),
               "cuDNN offers no deterministic convolution algorithm within ", cap >> 20,
               " MiB of workspace for input [", cs.n, ", ", cs.c, ", ", cs.h, ", ", cs.w,
               "] filter [", cs.k, ", ", cs.c, ", ", cs.r, ", ", cs.s, "] in ", dtype_name(t),
               " (raise RINGTRAIN_CUDA_CONV_WORKSPACE_MB)");
    }
    slot = std::move(plan);
  }
  return *slot;
}

void CudaBackend::conv2d_forward(const ConvShape& cs, const Tensor& x, const Tensor& w,
                                 const Tensor* bias, Activation act, const Tensor& y) {
  check_conv_shapes(cs, x, w, y);
  check_device(x, "convolution input");
  check_device(w, "convolution filter");
  check_device(y, "convolution output");
  if (bias) {
    check_device(*bias, "convolution bias");
    RT_CHECK(bias->numel() == cs.k, "convolution bias has ", bias->numel(), " elements, expected ",
             cs.k);
  }
  ConvPlan& plan = conv_plan(cs, w.dtype);
  const Tensor x2 = as_dtype(x, plan.dtype, kScratchA), w2 = as_dtype(w, plan.dtype, kScratchB);
  Tensor y2 = y;
  if (y.dtype != plan.dtype)
    y2 = Tensor(scratch(kScratchC, size_t(y.numel()) * dtype_size(plan.dtype)), y.shape, plan.dtype,
                device());
  void* ws = plan.fwd_ws ? scratch(kWorkspace, plan.fwd_ws) : nullptr;
  const float one = 1.f, zero = 0.f;
  CUDNN_CHECK(cudnnConvolutionForward(rt_.cudnn(), &one, plan.x, x2.data, plan.w, w2.data, plan.fwd,
                                      plan.fwd_algo, ws, plan.fwd_ws, &zero, plan.y, y2.data));
  if (y2.data != y.data) launch_cast(y2.data, y2.dtype, y.data, y.dtype, y.numel(), stream());
  if (bias || act != Activation::none) {
    // A zero bias when none is given keeps the activation in the same fused pass.
    const void* b = bias ? bias->data : scratch(kReduce, size_t(cs.k) * 4);
    if (!bias) CUDA_CHECK(cudaMemsetAsync(const_cast<void*>(b), 0, size_t(cs.k) * 4, stream()));
    launch_bias_act(y.data, y.dtype, b, bias ? bias->dtype : DType::f32, cs.n, cs.k,
                    cs.p() * cs.q(), act == Activation::relu ? 1 : 0, stream());
  }
}

void CudaBackend::conv2d_backward_data(const ConvShape& cs, const Tensor& dy, const Tensor& w,
                                       const Tensor& dx) {
  check_conv_shapes(cs, dx, w, dy);
  check_device(dy, "convolution output gradient");
  check_device(w, "convolution filter");
  check_device(dx, "convolution input gradient");
  ConvPlan& plan = conv_plan(cs, w.dtype);
  const Tensor dy2 = as_dtype(dy, plan.dtype, kScratchA), w2 = as_dtype(w, plan.dtype, kScratchB);
  Tensor dx2 = dx;
  if (dx.dtype != plan.dtype)
    dx2 = Tensor(scratch(kScratchC, size_t(dx.numel()) * dtype_size(plan.dtype)), dx.shape,
                 plan.dtype, device());
  void* ws = plan.data_ws ? scratch(kWorkspace, plan.data_ws) : nullptr;
  const float one = 1.f, zero = 0.f;
  CUDNN_CHECK(cudnnConvolutionBackwardData(rt_.cudnn(), &one, plan.w, w2.data, plan.y, dy2.data,
                                           plan.bwd_data, plan.data_algo, ws, plan.data_ws, &zero,
                                           plan.x, dx2.data));
  if (dx2.data != dx.data)
    launch_cast(dx2.data, dx2.dtype, dx.data, dx.dtype, dx.numel(), stream());
}

void CudaBackend::conv2d_backward_filter(const ConvShape& cs, const Tensor& x, const Tensor& dy,
                                         const Tensor& dw, const Tensor* db) {
  check_conv_shapes(cs, x, dw, dy);
  check_device(x, "convolution input");
  check_device(dy, "convolution output gradient");
  check_device(dw, "convolution filter gradient");
  ConvPlan& plan = conv_plan(cs, dw.dtype);
  const Tensor x2 = as_dtype(x, plan.dtype, kScratchA), dy2 = as_dtype(dy, plan.dtype, kScratchB);
  Tensor dw2 = dw;
  if (dw.dtype != plan.dtype)
    dw2 = Tensor(scratch(kScratchC, size_t(dw.numel()) * dtype_size(plan.dtype)), dw.shape,
                 plan.dtype, device());
  void* ws = plan.filter_ws ? scratch(kWorkspace, plan.filter_ws) : nullptr;
  const float one = 1.f, zero = 0.f;
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(rt_.cudnn(), &one, plan.x, x2.data, plan.y, dy2.data,
                                             plan.bwd_filter, plan.filter_algo, ws, plan.filter_ws,
                                             &zero, plan.w, dw2.data));
  if (dw2.data != dw.data)
    launch_cast(dw2.data, dw2.dtype, dw.data, dw.dtype, dw.numel(), stream());
  if (db) {
    check_device(*db, "convolution bias gradient");
    RT_CHECK(db->numel() == cs.k, "convolution bias gradient has ", db->numel(),
             " elements, expected ", cs.k);
    auto* partial = static_cast<float*>(scratch(kReduce, size_t(kBiasGradSlices * cs.k) * 4));
    launch_bias_grad(dy.data, dy.dtype, cs.n, cs.k, cs.p() * cs.q(), partial, db->data, db->dtype,
                     stream());
  }
}

}  // namespace ringtrain::kernels::cuda
