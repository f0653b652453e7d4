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

// Owns a block of memory. CPU memory is 64-byte aligned (one cache line, one AVX-512 vector).
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, Device device = {});
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&&) noexcept = default;

  void* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  struct Free {
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
  Tensor& ensure(const Shape& shape, DType dtype, Device device = {}) {
    size_t need = size_t(shape_numel(shape)) * dtype_size(dtype);
    if (need > buffer.bytes() || !(buffer.device() == device)) buffer = Buffer(need, device);
    view = Tensor(buffer.data(), shape, dtype, device);
    return view;
  }
};

}  // namespace ringtrain
