// gpu_bench, kernels section: GEMM TFLOP/s against direct cuBLAS and the memory-bound
// passes against a device-to-device copy.
#include <algorithm>
#include <cmath>

#include "benchmarks/gpu/bench_common.hpp"
#include "benchmarks/gpu/bench_sections.hpp"

namespace ringtrain::gpubench {
// Our row-major C[m,n] = A[m,k] B[n,k]^T (Linear's forward) against cuBLAS directly.
GemmRow bench_gemm(kernels::Backend& be, cublasHandle_t h, cublasLtHandle_t lt, cudaStream_t s,
                   const std::string& name, int64_t m, int64_t n, int64_t k, DType t, bool tf32) {
  kernels::cuda::set_tf32(tf32);
  OwnedTensor a, b, c, c_ref;
  a.ensure({m, k}, t, kGpu);
  b.ensure({n, k}, t, kGpu);
  c.ensure({m, n}, t, kGpu);
  c_ref.ensure({m, n}, t, kGpu);
  fill_uniform(a.view, 1);
  fill_uniform(b.view, 2);
  const double flops = 2.0 * double(m) * double(n) * double(k);
  const int iters = flops > 1e12 ? 10 : flops > 1e10 ? 50 : 200;
  const double t_ours =
      time_it(s, 3, iters, [&] { be.gemm(false, true, 1.f, a.view, b.view, 0.f, c.view); });
  // Direct cuBLAS, column-major: C^T[n,m] = B[n,k] (as col-major k x n, transposed) * A^T.
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const float one = 1.f, zero = 0.f;
  CHECK_CUBLAS(cublasSetStream(h, s));
  const double t_ex = time_it(s, 3, iters, [&] {
    CHECK_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one,
                              b.view.data, cuda_type(t), int(k), a.view.data, cuda_type(t), int(k),
                              &zero, c_ref.view.data, cuda_type(t), int(n), compute,
                              CUBLAS_GEMM_DEFAULT));
  });
  // cuBLASLt with its heuristic's first algorithm, chosen outside the timing.
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CHECK_CUBLAS(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F));
  CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&la, cuda_type(t), uint64_t(k), uint64_t(n), k));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lb, cuda_type(t), uint64_t(k), uint64_t(m), k));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lc, cuda_type(t), uint64_t(n), uint64_t(m), n));
  cublasLtMatmulPreference_t pref;
  CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws_bytes = 32 << 20;
  CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws_bytes, sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &found));
  Buffer ws(ws_bytes, kGpu);
  double t_lt = 1e30;
  if (found > 0)
    t_lt = time_it(s, 3, iters, [&] {
      CHECK_CUBLAS(cublasLtMatmul(lt, op, &one, b.view.data, la, a.view.data, lb, &zero,
                                  c_ref.view.data, lc, c_ref.view.data, lc, &res.algo, ws.data(),
                                  ws_bytes, s));
    });
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  // Results checked after timing: ours against the reference.
  be.gemm(false, true, 1.f, a.view, b.view, 0.f, c.view);
  kernels::cuda::synchronize(0);
  const auto x = download(c.view), y = download(c_ref.view);
  double md = 0, mx = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    md = std::max(md, double(std::fabs(x[i] - y[i])));
    mx = std::max(mx, double(std::fabs(y[i])));
  }
  GemmRow r{name, tf32 ? "tf32" : dtype_name(t), m, n, k, 0, 0, 0, md / std::max(mx, 1e-30)};
  const double t_ref = std::min(t_ex, t_lt);
  r.ours_tflops = flops / t_ours / 1e12;
  r.ref_tflops = flops / t_ref / 1e12;
  r.ratio = t_ref / t_ours;
  kernels::cuda::set_tf32(false);
  return r;
}

// Device-to-device copy of `bytes`: bytes read + written per second.
BandwidthRow bench_copy(cudaStream_t s, size_t bytes) {
  Buffer a(bytes, kGpu), b(bytes, kGpu);
  CHECK_CUDA(cudaMemsetAsync(a.data(), 1, bytes, s));
  const double t = time_it(s, 3, 20, [&] {
    CHECK_CUDA(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s));
  });
  const double moved = 2.0 * double(bytes);
  return {"device-to-device copy", "-", moved, t, moved / t / 1e9, 1.0};
}

// The step's memory-bound tail over n parameters in `precision`, as bench_train runs it:
// unscale + non-finite check of the compute-dtype gradients into fp32 (in place for fp32),
// then AdamW on the fp32 masters and moments, writing the working copy (16-bit only).
BandwidthRow bench_optimizer(kernels::Backend& be, cudaStream_t s, int64_t n, DType precision) {
  const size_t e = dtype_size(precision);
  OwnedTensor grad, g32, master, m, v, work;
  grad.ensure({n}, precision, kGpu);
  fill_uniform(grad.view, 5);
  Tensor grad32 = grad.view;
  if (precision != DType::f32) grad32 = g32.ensure({n}, DType::f32, kGpu);
  fill_uniform(master.ensure({n}, DType::f32, kGpu), 6);
  CHECK_CUDA(cudaMemsetAsync(m.ensure({n}, DType::f32, kGpu).data, 0, size_t(n) * 4, s));
  CHECK_CUDA(cudaMemsetAsync(v.ensure({n}, DType::f32, kGpu).data, 0, size_t(n) * 4, s));
  Tensor* w = precision == DType::f32 ? nullptr : &work.ensure({n}, precision, kGpu);
  kernels::AdamWConfig cfg;
  bool nonfinite = false;
  const double t = time_it(s, 3, 20, [&] {
    // unscale by 1: the values stay put, every pass moves the same bytes
    nonfinite |= be.unscale_check(grad.view, 1.f, grad32);
    be.adamw_step(cfg, master.view, grad32, m.view, v.view, w);
    ++cfg.step;
  });
  RT_CHECK(!nonfinite, "unscale_check found non-finite values in finite gradients");
  // unscale: read e, write 4; AdamW: read master, g32, m, v, write master, m, v (+ work).
  const double per = double(e + 4) + 28.0 + (precision == DType::f32 ? 0.0 : double(e));
  const double moved = per * double(n);
  return {"unscale+check+AdamW", dtype_name(precision), moved, t, moved / t / 1e9, 0};
}

// A convolution's bias gradient (conv2d_backward_filter's db, our per-channel reduction)
// over dy [n, k, h, w], timed as the difference of the backward filter pass with and
// without db (the cuDNN part cancels): dy's bytes read once per second.
BandwidthRow bench_bias_grad(kernels::Backend& be, cudaStream_t s, DType t) {
  kernels::ConvShape cs;
  cs.n = 256, cs.c = 64, cs.h = 28, cs.w = 28, cs.k = 64, cs.r = 3, cs.s = 3;
  cs.stride = 1, cs.pad = 1;
  OwnedTensor x, dy, dw, db;
  fill_uniform(x.ensure({cs.n, cs.c, cs.h, cs.w}, t, kGpu), 7);
  fill_uniform(dy.ensure({cs.n, cs.k, cs.p(), cs.q()}, t, kGpu), 8);
  dw.ensure({cs.k, cs.c, cs.r, cs.s}, t, kGpu);
  db.ensure({cs.k}, DType::f32, kGpu);
  const double with =
      time_it(s, 3, 20, [&] { be.conv2d_backward_filter(cs, x.view, dy.view, dw.view, &db.view); });
  const double without =
      time_it(s, 3, 20, [&] { be.conv2d_backward_filter(cs, x.view, dy.view, dw.view, nullptr); });
  const double moved = double(dy.view.bytes());
  const double sec = std::max(with - without, 1e-9);
  return {"conv bias gradient [256,64,28,28]", dtype_name(t), moved, sec, moved / sec / 1e9, 0};
}

}  // namespace ringtrain::gpubench
