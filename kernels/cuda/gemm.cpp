// CudaBackend::gemm: row-major C = alpha op(A) op(B) + beta C through cuBLASLt, computed as
// the column-major C^T = op(B)^T op(A)^T (a row-major matrix is its transpose in column
// major, so no data moves). Which dtypes cuBLAS sees is choose_gemm_types() (gemm_types.hpp):
// any 16-bit operand puts the product on tensor cores with fp32 accumulation (an fp32
// operand beside a 16-bit one is rounded to that dtype, as autocast does); fp32 with fp32 is
// strict fp32 unless RINGTRAIN_CUDA_TF32=1; a C dtype cuBLAS cannot write from those inputs
// goes through fp32 scratch and one rounding. Each (shape, dtypes, alignment) gets a plan —
// descriptors and the heuristic's algorithm — made once; cublasGemmEx is the fallback when
// the heuristic has none (or on request: RINGTRAIN_CUDA_GEMM=gemmex).
#include <cstdio>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/gemm_types.hpp"
#include "kernels/cuda/launch.hpp"

namespace ringtrain::kernels::cuda {

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      break;
  }
  throw_runtime(__FILE__, __LINE__, cat("gemm of ", dtype_name(t), " is not supported"));
}

// The largest power of two (up to 256) that divides the address: cuBLASLt's heuristic must
// only offer kernels that can load operands aligned like that.
uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a) a >>= 1;
  return a;
}

}  // namespace

void CudaBackend::do_gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                          float beta, const Tensor& c) {
  // (shapes checked by Backend::gemm)
  const int64_t m = trans_a ? a.dim(1) : a.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
  if (m == 0 || n == 0) return;
  const GemmTypes g = choose_gemm_types(a.dtype, b.dtype, c.dtype, cuda_env().tf32);
  const Tensor a2 = as_dtype(a, g.in, kScratchA), b2 = as_dtype(b, g.in, kScratchB);
  if (g.out == c.dtype) return gemm_direct(trans_a, trans_b, alpha, a2, b2, beta, c, g.tf32);
  // A C dtype cuBLAS does not write from these inputs: compute into fp32, round once.
  Tensor c32(scratch(kScratchC, size_t(c.numel()) * 4), c.shape, DType::f32, device());
  if (beta != 0.f) launch_cast(c.data, c.dtype, c32.data, DType::f32, c.numel(), stream());
  gemm_direct(trans_a, trans_b, alpha, a2, b2, beta, c32, g.tf32);
  launch_cast(c32.data, DType::f32, c.data, c.dtype, c.numel(), stream());
}

void CudaBackend::gemm_direct(bool trans_a, bool trans_b, float alpha, const Tensor& a,
                              const Tensor& b, float beta, const Tensor& c, bool tf32) {
  const int64_t m = c.dim(0), n = c.dim(1), k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t lda = a.dim(1), ldb = b.dim(1), ldc = n;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS's A is our B
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  // k == 0: C = beta C (cuBLAS handles it; nothing to multiply).
  if (k == 0 && beta == 1.f) return;

  if (cuda_env().gemm_ex) {
    CUBLAS_CHECK(cublasGemmEx(rt_.cublas(), op_a, op_b, int(n), int(m), int(k), &alpha, b.data,
                              cuda_type(b.dtype), int(ldb), a.data, cuda_type(a.dtype), int(lda),
                              &beta, c.data, cuda_type(c.dtype), int(ldc), compute,
                              CUBLAS_GEMM_DEFAULT));
    return;
  }

  const uint32_t al_a = alignment(b.data), al_b = alignment(a.data);
  const uint32_t al_c = std::min(alignment(c.data), 256u);
  // The plan's key: shapes, transposes, dtypes, TF32 and the operands' alignment (no
  // string formatting: small GEMMs are launch-bound, and this runs on every call).
  const GemmKey key{m,
                    n,
                    k,
                    int64_t(trans_a) | int64_t(trans_b) << 1 | int64_t(tf32) << 2,
                    int64_t(a.dtype) | int64_t(b.dtype) << 8 | int64_t(c.dtype) << 16,
                    int64_t(al_a) | int64_t(al_b) << 16 | int64_t(al_c) << 32};
  auto& slot = gemm_plans_[key];
  if (!slot) {
    auto plan = std::make_unique<GemmPlan>();
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    // Stored (pre-op) column-major shapes: our row-major B [rows, cols] is B^T col-major.
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, cuda_type(b.dtype), uint64_t(b.dim(1)),
                                            uint64_t(b.dim(0)), ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, cuda_type(a.dtype), uint64_t(a.dim(1)),
                                            uint64_t(a.dim(0)), lda));
    CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&plan->c, cuda_type(c.dtype), uint64_t(n), uint64_t(m), ldc));
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = cuda_env().gemm_workspace;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
        rt_.lt(), plan->op, plan->a, plan->b, plan->c, plan->c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs == CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
      plan->algo = res.algo;
      plan->has_algo = true;
    }
    slot = std::move(plan);
  }
  if (!slot->has_algo) {  // no cuBLASLt kernel for this case: the classic API
    CUBLAS_CHECK(cublasGemmEx(rt_.cublas(), op_a, op_b, int(n), int(m), int(k), &alpha, b.data,
                              cuda_type(b.dtype), int(ldb), a.data, cuda_type(a.dtype), int(lda),
                              &beta, c.data, cuda_type(c.dtype), int(ldc), compute,
                              CUBLAS_GEMM_DEFAULT));
    return;
  }
  const size_t ws = cuda_env().gemm_workspace;
  void* workspace = scratch(kWorkspace, ws);
  CUBLAS_CHECK(cublasLtMatmul(rt_.lt(), slot->op, &alpha, b.data, slot->a, a.data, slot->b, &beta,
                              c.data, slot->c, c.data, slot->c, &slot->algo, workspace, ws,
                              stream()));
}

}  // namespace ringtrain::kernels::cuda
