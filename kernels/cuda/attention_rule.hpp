// Which implementation runs the CUDA backend's causal attention: cuDNN's fused attention
// (the graph API's SDPA, kernels/cuda/cudnn_attention.cpp) or ringtrain's own kernel
// (transformer.cu). Pure host functions, so that the rule is tested on any machine
// (tests/gpu/test_attention_rule.cpp); attention_select.cpp applies it once per shape.
//
// RINGTRAIN_CUDA_ATTENTION: `kernel` always runs our kernel; `auto` (the default) runs cuDNN
// when the build has cudnn-frontend, the dtype is fp16 or bf16 (cuDNN's SDPA has no fp32)
// and cuDNN's support check accepts the shape, else our kernel; `cudnn` demands cuDNN for
// every 16-bit attention and is an error where it cannot be had. fp32 always runs our kernel.
// Forward and backward take the same decision for a shape, because cuDNN's statistics and
// our log-sum-exp are never mixed between the two passes.
#pragma once

#include <string>

#include "core/dtype.hpp"
#include "core/error.hpp"

namespace ringtrain::kernels::cuda {

enum class AttentionMode { automatic, cudnn, kernel };
enum class AttentionPath { kernel, cudnn };

inline const char* attention_path_name(AttentionPath p) {
  return p == AttentionPath::cudnn ? "cudnn" : "kernel";
}

// The value of RINGTRAIN_CUDA_ATTENTION ("" when unset).
inline AttentionMode parse_attention_mode(const std::string& value) {
  if (value.empty() || value == "auto") return AttentionMode::automatic;
  if (value == "cudnn") return AttentionMode::cudnn;
  if (value == "kernel") return AttentionMode::kernel;
  throw_input(cat("RINGTRAIN_CUDA_ATTENTION='", value, "' is not one of auto, cudnn, kernel"));
}

// Whether cuDNN is worth asking about a shape at all (its support check builds a graph).
inline bool attention_asks_cudnn(AttentionMode mode, bool cudnn_built, DType dtype) {
  return mode != AttentionMode::kernel && cudnn_built &&
         (dtype == DType::f16 || dtype == DType::bf16);
}

// The path for one shape. `cudnn_supported` and `why_not` are cuDNN's answer for the shape
// (read only when attention_asks_cudnn was true). Under `cudnn`, a 16-bit attention that
// cuDNN cannot run is an input error naming the setting and the reason.
inline AttentionPath choose_attention_path(AttentionMode mode, bool cudnn_built, DType dtype,
                                           bool cudnn_supported, const std::string& why_not) {
  const bool sixteen = dtype == DType::f16 || dtype == DType::bf16;
  if (mode == AttentionMode::kernel || !sixteen) return AttentionPath::kernel;
  if (mode == AttentionMode::cudnn) {
    RT_REQUIRE(cudnn_built,
               "RINGTRAIN_CUDA_ATTENTION=cudnn, but this build has no cudnn-frontend (configure "
               "with RINGTRAIN_CUDNN_FRONTEND_DIR; tools/install-deps.sh fetches it), or use "
               "auto|kernel");
    RT_REQUIRE(cudnn_supported, "RINGTRAIN_CUDA_ATTENTION=cudnn, but cuDNN cannot run this ",
               dtype_name(dtype), " attention: ", why_not, "; use auto|kernel");
    return AttentionPath::cudnn;
  }
  return cudnn_built && cudnn_supported ? AttentionPath::cudnn : AttentionPath::kernel;
}

}  // namespace ringtrain::kernels::cuda
