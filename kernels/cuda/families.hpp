// The CUDA backend's kernel families, one file each, registered into its kernel table
// (kernel_table.hpp) when the first CudaBackend is used. A new family file adds its line here;
// a new op of an existing family does not.
#pragma once

#define RT_CUDA_KERNEL_FAMILIES(X)                                                           \
  X(core)       /* cuda_backend.cpp: the ops of cuda_backend, gemm, conv, transformer_ops */ \
  X(activation) /* activation.cu: the pointwise activations */                               \
  X(loss)       /* loss_ops.cpp, loss.cu: regression, multi-label and per-pixel losses */    \
  X(llama)      /* llama_ops.cpp, llama.cu: rmsnorm, mul, rope */
