// The CUDA API of a build without CUDA (RINGTRAIN_CUDA=OFF or nothing found): it answers
// "not built" so that callers need no #if (style.md: supports() instead of #ifdef forests).
#include "core/error.hpp"
#include "kernels/cuda/cuda_api.hpp"

namespace ringtrain::kernels::cuda {
namespace {
[[noreturn]] void not_built() {
  throw_input(
      "--device cuda: this build of ringtrain has no CUDA backend (configure with "
      "-DRINGTRAIN_CUDA=ON on a machine with nvcc, cuDNN and NCCL); use --device cpu");
}
}  // namespace

bool built() { return false; }
int device_count(std::string* why) {
  if (why) *why = "this build has no CUDA backend";
  return 0;
}
DeviceInfo device_info(int) { not_built(); }
int device_for_local_rank(int) { not_built(); }
std::string library_versions() { return "not built"; }
std::unique_ptr<Backend> make_cuda_backend(int, const MemoryPolicy&) { not_built(); }
AllocatorStats allocator_stats(int) { not_built(); }
void release_cached_memory(int) {}
void synchronize(int) {}
void* compute_stream(int) { not_built(); }
void queue_cast(Backend&, int, const Tensor&, const Tensor&) { not_built(); }
void set_tf32(bool) {}
bool tf32() { return false; }
void copy_tensor(const Tensor& dst, const Tensor& src) {
  RT_CHECK(dst.bytes() == src.bytes(), "copy of ", src.bytes(), " bytes into ", dst.bytes());
  copy_bytes(dst.data, dst.device, src.data, src.device, src.bytes());
}

}  // namespace ringtrain::kernels::cuda
