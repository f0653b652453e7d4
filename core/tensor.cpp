// Buffer allocation (CPU; device allocators arrive with their backends) and shape printing.
#include "core/tensor.hpp"

#include <cstdlib>
#include <cstring>

#include "core/error.hpp"

namespace ringtrain {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Buffer::Buffer(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  RT_CHECK(device.kind == Device::cpu, "only CPU buffers are built in this configuration");
  if (bytes == 0) return;
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw_runtime(__FILE__, __LINE__, cat("out of host memory allocating ", bytes, " bytes"));
  std::memset(p, 0, rounded);
  data_.reset(p);
}

void Buffer::Free::operator()(void* p) const { std::free(p); }

}  // namespace ringtrain
