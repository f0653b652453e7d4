// select_attention_path and the per-path call counts (cudnn_attention.hpp): the rule of
// attention_rule.hpp applied to what this build has and what cuDNN says about the shape.
#include <atomic>
#include <cstdio>
#include <mutex>
#include <vector>

#include "core/env.hpp"
#include "kernels/cuda/cudnn_attention.hpp"
#include "kernels/cuda/runtime.hpp"

namespace ringtrain::kernels::cuda {
namespace {

std::atomic<int64_t> cudnn_calls{0}, kernel_calls{0};

// Says once per shape that cuDNN refused it (every rank has the same shapes, so all ranks
// take the same path).
void warn_fallback_once(const SdpaShape& s, const std::string& why) {
  static std::mutex mu;
  static std::vector<SdpaShape> warned;
  std::lock_guard<std::mutex> lock(mu);
  for (const SdpaShape& w : warned)
    if (w == s) return;
  warned.push_back(s);
  std::fprintf(stderr,
               "ringtrain: cuDNN attention cannot run B=%lld T=%lld heads=%lld head size=%lld "
               "%s (%s); running ringtrain's attention kernel\n",
               static_cast<long long>(s.b), static_cast<long long>(s.t),
               static_cast<long long>(s.heads), static_cast<long long>(s.hs), dtype_name(s.dtype),
               why.c_str());
}

}  // namespace

AttentionPath select_attention_path(DeviceRuntime& rt, const SdpaShape& s) {
  const AttentionMode mode = parse_attention_mode(env::cuda_attention());
  const bool built = cudnn_sdpa_built();
  if (!attention_asks_cudnn(mode, built, s.dtype))
    return choose_attention_path(mode, built, s.dtype, false, "");
  std::string why;
  const bool ok = cudnn_sdpa_prepare(rt, s, &why);
  const AttentionPath p = choose_attention_path(mode, built, s.dtype, ok, why);
  if (!ok) warn_fallback_once(s, why);
  return p;
}

AttentionCalls attention_calls() { return {cudnn_calls.load(), kernel_calls.load()}; }

void count_attention_call(AttentionPath p) {
  (p == AttentionPath::cudnn ? cudnn_calls : kernel_calls).fetch_add(1);
}

std::string attention_paths_between(const AttentionCalls& before, const AttentionCalls& after) {
  const bool c = after.cudnn > before.cudnn, k = after.kernel > before.kernel;
  return c && k ? "cudnn+kernel" : c ? "cudnn" : k ? "kernel" : "none";
}

}  // namespace ringtrain::kernels::cuda
