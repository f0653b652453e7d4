// CudaBackend convolution through cuDNN (NCHW, cross-correlation, fp32 accumulation):
// forward, backward data, backward filter. Each (shape, dtype, TF32 setting) gets a plan:
// tensor, filter and convolution descriptors and, per direction, a deterministic algorithm
// within the workspace cap (RINGTRAIN_CUDA_CONV_WORKSPACE_MB), chosen by choose_conv_algo()
// (conv_select.hpp): the _v7 heuristic's rows first, then cuDNN's deterministic algorithms
// one by one, each with its workspace asked again for the math type actually set. fp32 is
// strict (CUDNN_FMA_MATH) unless RINGTRAIN_CUDA_TF32=1. Where cuDNN has no deterministic
// algorithm for a 16-bit dtype (NCHW tensor-core kernels do not exist for every shape), the
// plan runs in fp32 on converted copies and says so once on stderr; where fp32 has none
// either, the error names the shape and the workspace the smallest algorithm needs. Bias
// and activation are one fused pass of our own after the convolution; the bias gradient is
// our deterministic reduction.
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda/conv_select.hpp"
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

// cuDNN's deterministic algorithms per direction (cuDNN API reference, "Reproducibility":
// every forward algorithm; backward data all but ALGO_0; backward filter all but ALGO_0 and
// ALGO_3), tried in this order when no row of the heuristic fits: the GEMM kinds first
// (least workspace), FFT last (most).
const std::vector<int> kFwdFallback = {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                                       CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                                       CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
                                       CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
                                       CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
                                       CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
                                       CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
                                       CUDNN_CONVOLUTION_FWD_ALGO_FFT};
const std::vector<int> kDataFallback = {
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED, CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT};
const std::vector<int> kFilterFallback = {
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT};

// The heuristic's rows; none when the query itself failed (the fallback list then decides).
template <typename Perf>
std::vector<ConvCandidate> candidates(cudnnStatus_t st, const Perf* perf, int count) {
  std::vector<ConvCandidate> out;
  if (st != CUDNN_STATUS_SUCCESS) return out;
  for (int i = 0; i < count; ++i)
    out.push_back({int(perf[i].algo), perf[i].status == CUDNN_STATUS_SUCCESS,
                   perf[i].determinism == CUDNN_DETERMINISTIC, int(perf[i].mathType),
                   perf[i].memory});
  return out;
}

// One direction: the choice, with the math type it was sized for left on the descriptor;
// "" or why there is none.
std::string choose(const char* direction, cudnnStatus_t heuristic_status,
                   const std::vector<ConvCandidate>& rows, const std::vector<int>& fallback,
                   const ConvSelectRules& rules, cudnnConvolutionDescriptor_t desc,
                   const std::function<cudnnStatus_t(int algo, size_t*)>& size_of, int& algo,
                   size_t& ws) {
  const ConvChoice c =
      choose_conv_algo(rows, fallback, rules, [&](int a, int math) -> std::optional<size_t> {
        if (cudnnSetConvolutionMathType(desc, cudnnMathType_t(math)) != CUDNN_STATUS_SUCCESS)
          return std::nullopt;
        size_t bytes = 0;
        if (size_of(a, &bytes) != CUDNN_STATUS_SUCCESS) return std::nullopt;
        return bytes;
      });
  if (!c.found)
    return cat(
        direction, ": ",
        c.smallest_over_cap ? cat("the smallest deterministic algorithm needs ",
                                  c.smallest_over_cap >> 20, " MiB of workspace")
                            : std::string("no deterministic algorithm is supported"),
        heuristic_status == CUDNN_STATUS_SUCCESS
            ? std::string()
            : cat(" (the heuristic query failed: ", cudnnGetErrorString(heuristic_status), ")"));
  CUDNN_CHECK(cudnnSetConvolutionMathType(desc, cudnnMathType_t(c.math)));
  algo = c.algo;
  ws = c.workspace;
  return "";
}

// Descriptors and algorithms for `t`: "" when every direction has one, else why not.
std::string build(cudnnHandle_t h, const ConvShape& cs, DType t, size_t cap, ConvPlan& plan) {
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
  ConvSelectRules rules;
  rules.strict_fp32 = t == DType::f32 && !cuda_env().tf32;
  rules.fma_math = CUDNN_FMA_MATH;
  rules.default_math = CUDNN_DEFAULT_MATH;
  // The math type the heuristic is asked with, and the fallback algorithms' (on Ampere and
  // later CUDNN_DEFAULT_MATH allows TF32 for fp32).
  const cudnnMathType_t math = t != DType::f32     ? CUDNN_TENSOR_OP_MATH
                               : rules.strict_fp32 ? CUDNN_FMA_MATH
                                                   : CUDNN_DEFAULT_MATH;
  rules.fallback_math = math;
  rules.cap = cap;
  for (auto* c : {&plan.fwd, &plan.bwd_data, &plan.bwd_filter}) {
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(c));
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(*c, int(cs.pad), int(cs.pad), int(cs.stride),
                                                int(cs.stride), 1, 1, CUDNN_CROSS_CORRELATION,
                                                CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionMathType(*c, math));
  }
  std::string why;
  int count = 0, algo = 0;
  {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    const cudnnStatus_t st = cudnnGetConvolutionForwardAlgorithm_v7(
        h, plan.x, plan.w, plan.fwd, plan.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf);
    why = choose(
        "forward", st, candidates(st, perf, count), kFwdFallback, rules, plan.fwd,
        [&](int a, size_t* ws) {
          return cudnnGetConvolutionForwardWorkspaceSize(h, plan.x, plan.w, plan.fwd, plan.y,
                                                         cudnnConvolutionFwdAlgo_t(a), ws);
        },
        algo, plan.fwd_ws);
    if (!why.empty()) return why;
    plan.fwd_algo = cudnnConvolutionFwdAlgo_t(algo);
  }
  {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    const cudnnStatus_t st = cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, plan.w, plan.y, plan.bwd_data, plan.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count,
        perf);
    why = choose(
        "backward data", st, candidates(st, perf, count), kDataFallback, rules, plan.bwd_data,
        [&](int a, size_t* ws) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(
              h, plan.w, plan.y, plan.bwd_data, plan.x, cudnnConvolutionBwdDataAlgo_t(a), ws);
        },
        algo, plan.data_ws);
    if (!why.empty()) return why;
    plan.data_algo = cudnnConvolutionBwdDataAlgo_t(algo);
  }
  {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    const cudnnStatus_t st = cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, plan.x, plan.y, plan.bwd_filter, plan.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count,
        perf);
    why = choose(
        "backward filter", st, candidates(st, perf, count), kFilterFallback, rules, plan.bwd_filter,
        [&](int a, size_t* ws) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(
              h, plan.x, plan.y, plan.bwd_filter, plan.w, cudnnConvolutionBwdFilterAlgo_t(a), ws);
        },
        algo, plan.filter_ws);
    if (!why.empty()) return why;
    plan.filter_algo = cudnnConvolutionBwdFilterAlgo_t(algo);
  }
  return "";
}

std::string shape_text(const ConvShape& cs) {
  return cat("input [", cs.n, ", ", cs.c, ", ", cs.h, ", ", cs.w, "] filter [", cs.k, ", ", cs.c,
             ", ", cs.r, ", ", cs.s, "] stride ", cs.stride, " pad ", cs.pad);
}

}  // namespace

ConvPlan& CudaBackend::conv_plan(const ConvShape& cs, DType t) {
  char key[176];
  std::snprintf(key, sizeof key, "%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%d,%d",
                (long long)cs.n, (long long)cs.c, (long long)cs.h, (long long)cs.w, (long long)cs.k,
                (long long)cs.r, (long long)cs.s, (long long)cs.stride, (long long)cs.pad, int(t),
                int(cuda_env().tf32));
  auto& slot = conv_plans_[key];
  if (!slot) {
    auto plan = std::make_unique<ConvPlan>();
    const size_t cap = cuda_env().conv_workspace;
    const std::string why = build(rt_.cudnn(), cs, t, cap, *plan);
    if (!why.empty()) {
      RT_CHECK(t != DType::f32, "cuDNN offers no deterministic fp32 convolution algorithm within ",
               cap >> 20, " MiB of workspace for ", shape_text(cs), ": ", why,
               " (raise RINGTRAIN_CUDA_CONV_WORKSPACE_MB)");
      plan = std::make_unique<ConvPlan>();
      const std::string why32 = build(rt_.cudnn(), cs, DType::f32, cap, *plan);
      RT_CHECK(why32.empty(), "cuDNN offers no deterministic convolution algorithm within ",
               cap >> 20, " MiB of workspace for ", shape_text(cs), " in ", dtype_name(t), " (",
               why, ") nor in fp32 (", why32, "); raise RINGTRAIN_CUDA_CONV_WORKSPACE_MB");
      std::fprintf(stderr,
                   "ringtrain: warning: cuDNN has no deterministic %s algorithm for the "
                   "convolution with %s (%s); it runs in fp32 on converted copies, without "
                   "16-bit tensor cores\n",
                   dtype_name(t), shape_text(cs).c_str(), why.c_str());
      ++conv_fp32_fallbacks_;
    }
    slot = std::move(plan);
  }
  return *slot;
}

void CudaBackend::do_conv2d_forward(const ConvShape& cs, const Tensor& x, const Tensor& w,
                                    const Tensor* bias, Activation act, const Tensor& y) {
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

void CudaBackend::do_conv2d_backward_data(const ConvShape& cs, const Tensor& dy, const Tensor& w,
                                          const Tensor& dx) {
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

void CudaBackend::do_conv2d_backward_filter(const ConvShape& cs, const Tensor& x, const Tensor& dy,
                                            const Tensor& dw, const Tensor* db) {
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
    auto* partial = static_cast<float*>(scratch(kReduce, size_t(kBiasGradSlices * cs.k) * 4));
    launch_bias_grad(dy.data, dy.dtype, cs.n, cs.k, cs.p() * cs.q(), partial, db->data, db->dtype,
                     stream());
  }
}

}  // namespace ringtrain::kernels::cuda
