// Device, Buffer (owned memory) and Tensor (a non-owning view: pointer, shape, dtype,
// device). Layers, kernels, comm and io all speak in these three types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.hpp"
#include "core/memory_stats.hpp"

namespace ringtrain {

struct Device {
  enum Kind { cpu, cuda } kind = cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
};

using Shape = std::vector<int64_t>;

inline int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}
std::string shape_str(const Shape& s);  // "[64, 784]"

// Device memory without device headers: a backend that owns device memory (kernels/cuda)
// installs these at start-up; core only calls through them. Without them a cuda Buffer is
// an input error ("this build has no CUDA backend").
struct DeviceMemoryHooks {
  void* (*alloc)(size_t bytes, int device);  // zero-filled; throws ringtrain::Error on OOM
  void (*free)(void* p, size_t bytes, int device);
  // Any direction between host and device (or device and device); returns when done.
  void (*copy)(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
};
void set_device_memory_hooks(const DeviceMemoryHooks* hooks);  // nullptr uninstalls
const DeviceMemoryHooks* device_memory_hooks();

// The device a Buffer goes to when none is named: cpu, unless a DeviceScope on this thread
// says otherwise (like torch.cuda.device), so that model code allocates on the run's device
// without passing it through every call.
Device default_device();
class DeviceScope {
 public:
  explicit DeviceScope(Device d);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device prev_;
};

// What is allocating (a layer's name), for out-of-memory messages; per thread, nests.
class AllocScope {
 public:
  explicit AllocScope(std::string what);
  ~AllocScope();
  AllocScope(const AllocScope&) = delete;
  AllocScope& operator=(const AllocScope&) = delete;
  static const std::string& current();  // "" outside any scope

 private:
  std::string prev_;
};

// Copies bytes between any two devices (memcpy between host buffers).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

// Owns a block of memory. CPU memory is 64-byte aligned (one cache line, one AVX-512 vector).
// Its bytes are charged to the allocating thread's MemoryScope category while it lives.
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, Device device = default_device());
  Buffer(size_t bytes, Device device, MemCategory category);  // charged to `category`
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&&) noexcept = default;

  void* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  MemCategory category() const { return data_.get_deleter().category; }

 private:
  struct Free {
    Free() noexcept : bytes(0) {}
    Free(Device d, size_t b, MemCategory c) noexcept : device(d), bytes(b), category(c) {}
    Device device;
    size_t bytes;
    MemCategory category = MemCategory::workspace;
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  size_t bytes_ = 0;
  Device device_;
};

struct Tensor {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;
  Device device;

  Tensor() = default;
  Tensor(void* d, Shape s, DType t, Device dev = {})
      : data(d), shape(std::move(s)), dtype(t), device(dev) {}

  int64_t numel() const { return shape_numel(shape); }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(size_t i) const { return shape.at(i); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // A view of `n` elements starting at element `offset`, with the given shape.
  Tensor slice(int64_t offset, Shape s) const {
    return Tensor(static_cast<char*>(data) + offset * int64_t(dtype_size(dtype)), std::move(s),
                  dtype, device);
  }
};

// A Buffer plus the Tensor that views all of it: the usual way to own an activation.
struct OwnedTensor {
  Buffer buffer;
  Tensor view;
  // (Re)allocates only when the new shape needs more bytes than held.
  Tensor& ensure(const Shape& shape, DType dtype, Device device = default_device()) {
    size_t need = size_t(shape_numel(shape)) * dtype_size(dtype);
    if (need > buffer.bytes() || !(buffer.device() == device)) buffer = Buffer(need, device);
    view = Tensor(buffer.data(), shape, dtype, device);
    return view;
  }
};

}  // namespace ringtrain
