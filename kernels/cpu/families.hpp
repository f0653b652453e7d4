// The CPU backend's kernel families, one file each, registered into its kernel table
// (kernel_table.hpp) when the first CpuBackend is made. A new family file adds its line here;
// a new op of an existing family does not.
#pragma once

#define RT_CPU_KERNEL_FAMILIES(X)                                                       \
  X(core)       /* cpu_backend.cpp: gemm, cast, bias, relu, softmax_xent, reductions */ \
  X(unscale)    /* cpu_unscale.cpp */                                                   \
  X(optim)      /* cpu_optim.cpp */                                                     \
  X(conv)       /* cpu_conv.cpp: convolution and pooling */                             \
  X(batchnorm)  /* cpu_batchnorm.cpp */                                                 \
  X(pointwise)  /* cpu_pointwise.cpp: dropout, add */                                   \
  X(activation) /* cpu_activation.cpp: the pointwise activations */                     \
  X(embedding)  /* cpu_embedding.cpp */                                                 \
  X(layernorm)  /* cpu_layernorm.cpp */                                                 \
  X(attention)  /* cpu_attention.cpp */                                                 \
  X(token_xent) /* cpu_token_xent.cpp */                                                \
  X(rmsnorm)    /* cpu_rmsnorm.cpp */                                                   \
  X(rope)       /* cpu_rope.cpp: the rotary pack of grouped-query attention */          \
  X(loss)       /* cpu_loss.cpp: regression, multi-label and per-pixel losses */
