// cudnn_attention.hpp's cuDNN half for a build without cudnn-frontend: cuDNN is never asked
// (cudnn_sdpa_built() is false), so every attention runs ringtrain's kernel; the rest is
// unreachable and says so if called.
#include "core/error.hpp"
#include "kernels/cuda/cudnn_attention.hpp"

namespace ringtrain::kernels::cuda {

bool cudnn_sdpa_built() { return false; }

bool cudnn_sdpa_prepare(DeviceRuntime&, const SdpaShape&, std::string* why_not) {
  if (why_not) *why_not = "this build has no cudnn-frontend";
  return false;
}

size_t cudnn_sdpa_workspace(DeviceRuntime&, const SdpaShape&, bool) {
  RT_CHECK(false, "cuDNN attention is not built (no cudnn-frontend at configure time)");
  return 0;
}

void cudnn_sdpa_forward(DeviceRuntime&, const SdpaShape&, const void*, void*, float*, void*) {
  RT_CHECK(false, "cuDNN attention is not built (no cudnn-frontend at configure time)");
}

void cudnn_sdpa_backward(DeviceRuntime&, const SdpaShape&, const void*, const void*, const void*,
                         const float*, void*, void*) {
  RT_CHECK(false, "cuDNN attention is not built (no cudnn-frontend at configure time)");
}

}  // namespace ringtrain::kernels::cuda
