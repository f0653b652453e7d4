// The dtypes a CudaBackend::gemm hands to cuBLAS, chosen from the operands' dtypes alone (no
// CUDA here, so tests on machines without a GPU check the choice for every dtype mix the
// models produce). Mixed precision pairs the fp32 dlogits of the last layer with its 16-bit
// activations and weights in backward; those two GEMMs must run on tensor cores, not fall
// back to strict fp32 (the FMA pipes do ~1/15 of the tensor-core rate on an H100/H200).
#pragma once

#include "core/dtype.hpp"

namespace ringtrain::kernels::cuda {

struct GemmTypes {
  DType in = DType::f32;   // both operands are given to cuBLAS in this dtype (cast if needed)
  DType out = DType::f32;  // cuBLAS writes C in this dtype; c.dtype differs: fp32 scratch, cast
  bool tf32 = false;       // fp32 inputs on TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32)
  // Tensor cores do the products: 16-bit inputs (CUBLAS_COMPUTE_32F) or TF32.
  bool tensor_cores() const { return in != DType::f32 || tf32; }
};

// Accumulation is always fp32, rounded once into `out`.
//  - Both operands run in b's dtype. Linear (the one caller, core/layers.cpp) passes its own
//    tensor (x or W, in the layer's dtype) as b and, in backward, the incoming gradient as a,
//    so a mismatched a is the gradient of the next layer and is rounded to this layer's dtype,
//    as PyTorch's autocast does: the fp32 dlogits of the last layer of a 16-bit model meet its
//    16-bit activations and weights, and those two GEMMs run on tensor cores instead of
//    strict fp32; a layer kept in fp32 (--layer-precision) stays fp32 with 16-bit gradients
//    arriving. An fp32 value beyond fp16's range becomes inf, which the loss scaler's
//    non-finite check catches like any other fp16 overflow in backward.
//  - fp32 inputs: strict fp32 unless `tf32_allowed` (RINGTRAIN_CUDA_TF32=1).
//  - C: written directly when c is fp32 or the input dtype, else through fp32 and cast.
inline GemmTypes choose_gemm_types(DType a, DType b, DType c, bool tf32_allowed) {
  (void)a;  // a follows b
  GemmTypes g;
  g.in = b;
  g.tf32 = g.in == DType::f32 && tf32_allowed;
  g.out = c == g.in || c == DType::f32 ? c : DType::f32;
  return g;
}

}  // namespace ringtrain::kernels::cuda
