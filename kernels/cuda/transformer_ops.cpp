// CudaBackend's transformer ops: shape and dtype checks (shared with the CPU backend where
// kernels/kernels.cpp has them), scratch for the reductions, then the kernels of
// transformer.cu, or for 16-bit attention cuDNN's fused attention where
// select_attention_path chooses it (cudnn_attention.hpp). Only token_xent waits for the
// stream (it returns the loss). Token ids are not range-checked here: the token loader validates
// them against the model's vocabulary on the host before they are uploaded.
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cudnn_attention.hpp"
#include "kernels/cuda/launch.hpp"

namespace ringtrain::kernels::cuda {

void CudaBackend::do_embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor* wpe,
                                       const Tensor& y) {
  RT_CHECK(!wpe || wpe->dtype == wte.dtype, "token and positional embeddings differ in dtype");
  launch_embedding_fwd(tokens.as<int32_t>(), wte.data, wpe ? wpe->data : nullptr, wte.dtype, y.data,
                       y.dtype, tokens.numel(), tokens.dim(1), wte.dim(1), stream());
}

void CudaBackend::do_embedding_backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte,
                                        const Tensor* dwpe) {
  CUDA_CHECK(cudaMemsetAsync(dwte.data, 0, dwte.bytes(), stream()));
  if (dwpe) {
    CUDA_CHECK(cudaMemsetAsync(dwpe->data, 0, dwpe->bytes(), stream()));
  }
  const int64_t n = tokens.numel(), vocab = dwte.dim(0);
  void* work = scratch(kScratchA, embedding_bwd_scratch_bytes(n, vocab));
  launch_embedding_bwd(tokens.as<int32_t>(), dy.data, dy.dtype, dwte.as<float>(),
                       dwpe ? dwpe->as<float>() : nullptr, n, tokens.dim(1), dwte.dim(1), vocab,
                       work, stream());
}

void CudaBackend::do_layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                       float eps, const Tensor& y, const Tensor& mean,
                                       const Tensor& rstd) {
  const int64_t rows = layernorm_rows(x, gamma), c = gamma.numel();
  launch_layernorm_fwd(x.data, x.dtype, gamma.as<float>(), beta.as<float>(), eps, y.data, y.dtype,
                       mean.as<float>(), rstd.as<float>(), rows, c, stream());
}

void CudaBackend::do_layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                        const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                        const Tensor& dgamma, const Tensor& dbeta) {
  const int64_t rows = layernorm_rows(x, gamma), c = gamma.numel();
  RT_CHECK(dx.dtype == dy.dtype, "the CUDA layer norm gradient is written in dy's dtype ",
           dtype_name(dy.dtype), ", got dx ", dtype_name(dx.dtype));
  auto* partial = static_cast<float*>(scratch(kScratchA, size_t(2 * kLayerNormSlices * c) * 4));
  launch_layernorm_bwd(x.data, x.dtype, dy.data, dx.data, dx.dtype, gamma.as<float>(),
                       mean.as<float>(), rstd.as<float>(), partial, dgamma.as<float>(),
                       dbeta.as<float>(), rows, c, stream());
}

void CudaBackend::do_attention_forward(int64_t heads, const Tensor& qkv, const Tensor& out,
                                       const Tensor& lse) {
  const AttentionDims d = attention_dims(heads, qkv, out, lse);
  RT_CHECK(out.dtype == qkv.dtype, "attention output ", dtype_name(out.dtype), " for qkv ",
           dtype_name(qkv.dtype));
  const SdpaShape s{d.b, d.t, d.heads, d.hs, qkv.dtype};
  const AttentionPath path = select_attention_path(rt_, s);
  count_attention_call(path);
  if (path == AttentionPath::cudnn) {
    void* ws = scratch(kWorkspace, cudnn_sdpa_workspace(rt_, s, false));
    cudnn_sdpa_forward(rt_, s, qkv.data, out.data, lse.as<float>(), ws);
    return;
  }
  RT_CHECK(d.hs <= kMaxAttentionHeadSize, "attention head size ", d.hs, " is above the ",
           kMaxAttentionHeadSize, " the CUDA kernel holds");
  launch_attention_fwd(qkv.data, out.data, qkv.dtype, lse.as<float>(), d.b, d.t, d.heads, d.hs,
                       stream());
}

void CudaBackend::do_attention_backward(int64_t heads, const Tensor& qkv, const Tensor& out,
                                        const Tensor& dout, const Tensor& lse, const Tensor& dqkv) {
  const AttentionDims d = attention_dims(heads, qkv, out, lse);
  RT_CHECK(dout.numel() == out.numel() && dqkv.numel() == qkv.numel() && out.dtype == qkv.dtype &&
               dout.dtype == qkv.dtype && dqkv.dtype == qkv.dtype,
           "attention gradients must match qkv ", shape_str(qkv.shape), " ", dtype_name(qkv.dtype));
  // The forward's decision for the shape (cached), so the lse is read by the pass that wrote it.
  const SdpaShape s{d.b, d.t, d.heads, d.hs, qkv.dtype};
  const AttentionPath path = select_attention_path(rt_, s);
  count_attention_call(path);
  if (path == AttentionPath::cudnn) {
    void* ws = scratch(kWorkspace, cudnn_sdpa_workspace(rt_, s, true));
    cudnn_sdpa_backward(rt_, s, qkv.data, out.data, dout.data, lse.as<float>(), dqkv.data, ws);
    return;
  }
  RT_CHECK(d.hs <= kMaxAttentionHeadSize, "attention head size ", d.hs, " is above the ",
           kMaxAttentionHeadSize, " the CUDA kernel holds");
  auto* delta = static_cast<float*>(scratch(kScratchA, size_t(d.b * d.heads * d.t) * 4));
  launch_attention_bwd(qkv.data, out.data, dout.data, qkv.dtype, lse.as<float>(), delta, dqkv.data,
                       d.b, d.t, d.heads, d.hs, stream());
}

XentResult CudaBackend::do_token_xent(const Tensor& logits, const Tensor& targets, int64_t vocab,
                                      float grad_scale, const Tensor* dlogits) {
  const int64_t vp = logits.shape.back(), rows = logits.numel() / (vp ? vp : 1);
  const size_t need = size_t(rows) * 12 + 16;
  char* dev = static_cast<char*>(scratch(kReduce, need));
  auto* row_loss = reinterpret_cast<double*>(dev);
  auto* row_correct = reinterpret_cast<int32_t*>(dev + size_t(rows) * 8);
  auto* bad = reinterpret_cast<int32_t*>(dev + size_t(rows) * 12);
  CUDA_CHECK(cudaMemsetAsync(bad, 0, 4, stream()));
  launch_token_xent(logits.as<float>(), targets.as<int32_t>(), rows, vp, vocab,
                    grad_scale / float(rows), dlogits ? dlogits->as<float>() : nullptr, row_loss,
                    row_correct, bad, stream());
  // Read back and summed on the host in row order, as the CPU backend sums.
  std::vector<char> host(need);
  char* dst = need <= DeviceRuntime::kPinnedBytes ? static_cast<char*>(rt_.pinned()) : host.data();
  CUDA_CHECK(cudaMemcpyAsync(dst, dev, need, cudaMemcpyDeviceToHost, stream()));
  wait();
  int32_t bad_target = 0;
  std::memcpy(&bad_target, dst + size_t(rows) * 12, 4);
  RT_CHECK(bad_target == 0, "a target outside the vocabulary [0, ", vocab, ") in ", rows,
           " tokens");
  XentResult res;
  for (int64_t r = 0; r < rows; ++r) {
    double l = 0;
    int32_t ok = 0;
    std::memcpy(&l, dst + size_t(r) * 8, 8);
    std::memcpy(&ok, dst + size_t(rows) * 8 + size_t(r) * 4, 4);
    res.loss_sum += l;
    res.correct += ok;
  }
  return res;
}

}  // namespace ringtrain::kernels::cuda
