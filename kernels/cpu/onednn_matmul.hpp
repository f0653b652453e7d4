// GEMM through oneDNN's matmul primitive, the CPU backend's GEMM on CPUs with AVX2 or better
// (kernels/cpu/cpu_features.hpp says when). oneDNN generates its kernels at run time for the
// ISA the CPU reports, so its speed does not depend on a table of CPU models; it also runs
// bf16 (and, where this oneDNN has kernels for it, fp16) inputs natively with fp32
// accumulation. Primitives are cached per shape, transposition, dtypes, alpha and beta.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.hpp"

namespace ringtrain::kernels::cpu {

class OneDnnMatmul {
 public:
  OneDnnMatmul();
  ~OneDnnMatmul();
  // True when oneDNN has an optimised (not reference) kernel for inputs of dtype `in` and a
  // result of dtype `out` on this CPU; probed once per pair.
  bool supports(DType in, DType out);
  // c[m, n] = alpha op(a) op(b) + beta c (+ bias[n] on every row when bias is given, fp32),
  // row-major, a and b of dtype `in` (their stored rows are op(x)'s columns when transposed),
  // c of dtype `out`; fp32 accumulation, one rounding into `out`. Requires supports(in, out).
  // Safe to call from several threads at once (the attention kernel's heads): each call runs
  // on the calling thread's OpenMP team with its own stream and scratch memory.
  void run(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
           const void* b, DType in, float beta, void* c, DType out, const float* bias = nullptr);
  // oneDNN's implementation name for these dtypes, e.g. "brg:avx512_core_bf16" (probed with
  // a small shape), or "none".
  std::string impl_name(DType in, DType out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "oneDNN 2.6.3 isa avx512_core_bf16": the library and the ISA its JIT generates for.
std::string onednn_description();

}  // namespace ringtrain::kernels::cpu
