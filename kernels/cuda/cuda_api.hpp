// What the rest of ringtrain may know about the CUDA backend, without CUDA headers
// (design.md: only kernels/cuda and comm/nccl include them). In a build without CUDA the
// same functions exist (kernels/cuda/cuda_stub.cpp): built() is false, device_count() is 0
// with the reason, and make_cuda_backend() is an input error, so callers need no #if.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kernels/kernels.hpp"

namespace ringtrain::kernels::cuda {

// --gpu-memory: grow (cudaMalloc on demand, cached for reuse; like TensorFlow's memory
// growth) or reserve:FRACTION (one block of FRACTION of the device's memory up front,
// sub-allocated; nothing more is taken).
struct MemoryPolicy {
  bool reserve = false;
  double fraction = 0;
  static MemoryPolicy parse(std::string_view s);  // input error naming --gpu-memory
  std::string str() const;                        // "grow" or "reserve:0.9"
};

struct DeviceInfo {
  int index = 0;
  std::string name;  // "NVIDIA H200"
  size_t total_bytes = 0, free_bytes = 0;
  int cc_major = 0, cc_minor = 0;
  int driver_version = 0, runtime_version = 0;  // 12040 = 12.4
  int multiprocessors = 0;
  std::string pci_bus_id;
};

struct AllocatorStats {
  size_t in_use = 0;       // bytes handed out now
  size_t cached = 0;       // bytes held for reuse (grow) or free in the reserve (reserve)
  size_t peak_in_use = 0;  // high-water mark of in_use
  size_t reserved = 0;     // bytes taken from the device with cudaMalloc
  int64_t device_mallocs = 0, cache_hits = 0;
};

bool built();  // this build has the CUDA backend
// This rank's GPU: 0 when one device is visible (launch/ringrun set CUDA_VISIBLE_DEVICES),
// else local_rank modulo the visible devices; input error when there is none.
int device_for_local_rank(int local_rank);
// "cuda:0 NVIDIA H200, 139.8 GiB (139.1 free), compute capability 9.0, driver 12.8, runtime
// 13.0" for the start-up lines (rank 0 of each node prints it).
std::string describe(const DeviceInfo& d);
// A warning when `compute` needs more than the device has (fp16 below compute capability 7.0,
// bf16 below 8.0: no tensor cores for it, or no kernels at all); "" otherwise.
std::string precision_warning(const DeviceInfo& d, DType compute);
// Usable devices; 0 (with the reason in *why, e.g. "no CUDA driver") when there are none.
int device_count(std::string* why = nullptr);
DeviceInfo device_info(int index);
// "CUDA runtime 13.0, driver 13.0; cuBLASLt 13.0.0; cuDNN 9.19.0; NCCL 2.28.9" (compiled
// and, where a GPU is present, loaded versions), for --version and the start-up banner.
std::string library_versions();

// The backend for device `index`. The first call per device sets its memory policy and
// installs the device-memory hooks of core/tensor.hpp; later calls share the device's
// stream, handles and allocator (the policy must then be the same).
std::unique_ptr<Backend> make_cuda_backend(int index, const MemoryPolicy& policy = {});
AllocatorStats allocator_stats(int index);
// Returns cached blocks to the device (grow policy); what is in use stays.
void release_cached_memory(int index);
// Waits for everything queued on the device's stream (timing, tests).
void synchronize(int index);
// The device's compute stream as an opaque pointer (cudaStream_t), for comm/nccl.
void* compute_stream(int index);
// dst = src converted by `be` (a backend of device `index`), from any thread and without
// waiting: makes the device the calling thread's current one (cudaSetDevice is per thread)
// and queues the cast on the device's compute stream, so it runs after the work queued
// before it (the backward kernels that wrote src) and before the work queued after it (the
// collective that reads dst). The GradReducer's communication thread casts buckets to the
// wire dtype with it while backward goes on.
void queue_cast(Backend& be, int index, const Tensor& src, const Tensor& dst);

// fp32 GEMM and convolution on TF32 tensor cores (default off: strict fp32, like the CPU;
// also RINGTRAIN_CUDA_TF32=1). Takes effect for shapes not seen before the switch.
void set_tf32(bool on);
bool tf32();

// Copies between host and device memory (Tensor views of the same shape and dtype).
void copy_tensor(const Tensor& dst, const Tensor& src);

}  // namespace ringtrain::kernels::cuda
