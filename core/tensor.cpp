// Buffer allocation (CPU here; device memory through the hooks a device backend installs),
// the default-device and allocation-label scopes, and shape printing.
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

namespace {
const DeviceMemoryHooks* g_hooks = nullptr;
thread_local Device t_default_device{};
thread_local std::string t_alloc_scope;
}  // namespace

void set_device_memory_hooks(const DeviceMemoryHooks* hooks) { g_hooks = hooks; }
const DeviceMemoryHooks* device_memory_hooks() { return g_hooks; }

Device default_device() { return t_default_device; }
DeviceScope::DeviceScope(Device d) : prev_(t_default_device) { t_default_device = d; }
DeviceScope::~DeviceScope() { t_default_device = prev_; }

AllocScope::AllocScope(std::string what) : prev_(std::move(t_alloc_scope)) {
  t_alloc_scope = std::move(what);
}
AllocScope::~AllocScope() { t_alloc_scope = std::move(prev_); }
const std::string& AllocScope::current() { return t_alloc_scope; }

namespace {
const DeviceMemoryHooks& hooks_for(Device d) {
  if (!g_hooks)
    throw_input(cat("device cuda:", d.index,
                    " was asked for, but this build has no CUDA backend (or it was not started); "
                    "build with -DRINGTRAIN_CUDA=ON or use --device cpu"));
  return *g_hooks;
}
}  // namespace

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.kind == Device::cpu && src_device.kind == Device::cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
  hooks_for(dst_device.kind == Device::cpu ? src_device : dst_device)
      .copy(dst, dst_device, src, src_device, bytes);
}

Buffer::Buffer(size_t bytes, Device device, MemCategory category) : Buffer() {
  MemoryScope in(category);
  *this = Buffer(bytes, device);
}

Buffer::Buffer(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (device.kind != Device::cpu) {
    if (bytes == 0) return;
    void* p = hooks_for(device).alloc(bytes, device.index);
    data_ = std::unique_ptr<void, Free>(p, Free{device, bytes, MemoryScope::current()});
    memory_charge(true, MemoryScope::current(), int64_t(bytes));
    return;
  }
  if (bytes == 0) return;
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw_runtime(__FILE__, __LINE__, cat("out of host memory allocating ", bytes, " bytes"));
  std::memset(p, 0, rounded);
  data_ = std::unique_ptr<void, Free>(p, Free{device, bytes, MemoryScope::current()});
  memory_charge(false, MemoryScope::current(), int64_t(bytes));
}

void Buffer::Free::operator()(void* p) const {
  memory_charge(device.kind != Device::cpu, category, -int64_t(bytes));
  if (device.kind == Device::cpu)
    std::free(p);
  else if (g_hooks)
    g_hooks->free(p, bytes, device.index);
}

}  // namespace ringtrain
