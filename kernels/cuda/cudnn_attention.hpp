// The CUDA backend's two attention implementations behind one decision: cuDNN's fused
// attention (the graph API's scaled-dot-product attention through cudnn-frontend, in
// cudnn_attention.cpp, or cudnn_attention_stub.cpp when the build has no cudnn-frontend)
// and ringtrain's own kernel (transformer.cu). transformer_ops.cpp asks
// select_attention_path (attention_select.cpp, the rule of attention_rule.hpp) for every
// call; gpu_bench and the gpu tests read attention_calls() to say which path ran.
// No cuDNN types here: the tests and the benchmark include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.hpp"
#include "kernels/cuda/attention_rule.hpp"

namespace ringtrain::kernels::cuda {

class DeviceRuntime;

// One causal self-attention: qkv [B, T, 3C] with the heads interleaved (C = heads x hs),
// out [B, T, C], lse [B, heads, T] fp32 (the log-sum-exp of each query's scaled scores).
struct SdpaShape {
  int64_t b = 0, t = 0, heads = 0, hs = 0;
  DType dtype = DType::bf16;
  bool operator==(const SdpaShape&) const = default;
};

// ---- cudnn_attention.cpp (or the stub) -----------------------------------------------------
bool cudnn_sdpa_built();  // this build has cudnn-frontend
// Builds the forward and backward graphs for the shape on the runtime's cuDNN handle, once
// (cached); false with cuDNN's reason in *why_not when either cannot be built or run.
bool cudnn_sdpa_prepare(DeviceRuntime& rt, const SdpaShape& s, std::string* why_not);
// Workspace bytes of a prepared shape's forward or backward graph.
size_t cudnn_sdpa_workspace(DeviceRuntime& rt, const SdpaShape& s, bool backward);
// Queued on the runtime's compute stream; the shape must have been prepared.
void cudnn_sdpa_forward(DeviceRuntime& rt, const SdpaShape& s, const void* qkv, void* out,
                        float* lse, void* workspace);
void cudnn_sdpa_backward(DeviceRuntime& rt, const SdpaShape& s, const void* qkv, const void* out,
                         const void* dout, const float* lse, void* dqkv, void* workspace);

// ---- attention_select.cpp ------------------------------------------------------------------
// The path for this call under RINGTRAIN_CUDA_ATTENTION (read each call). A shape cuDNN
// refuses under `auto` runs our kernel and says so once on stderr.
AttentionPath select_attention_path(DeviceRuntime& rt, const SdpaShape& s);
// Attention calls (forward and backward) per path in this process, for reports and tests.
struct AttentionCalls {
  int64_t cudnn = 0, kernel = 0;
};
AttentionCalls attention_calls();
void count_attention_call(AttentionPath p);
// "cudnn", "kernel", "cudnn+kernel" or "none" for the calls between two readings.
std::string attention_paths_between(const AttentionCalls& before, const AttentionCalls& after);

}  // namespace ringtrain::kernels::cuda
