// The caching device allocator behind Buffer(bytes, Device{cuda, i}). Two policies
// (--gpu-memory): grow takes blocks from cudaMalloc on demand and keeps freed ones for
// reuse (sizes rounded: 512 B steps up to 1 MiB, 2 MiB steps above), returning the cache to
// the device and retrying once before it reports out-of-memory; reserve:F takes one block
// of F x the device's memory up front and sub-allocates it best-fit with coalescing.
// Every block is used on the device's one compute stream (NCCL waits on it by event), so a
// block freed here can be handed out again at once, in stream order. Thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda/cuda_api.hpp"

namespace ringtrain::kernels::cuda {

class Allocator {
 public:
  Allocator(int device, const MemoryPolicy& policy, cudaStream_t stream);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Zero-filled (in stream order), like host Buffers. Throws ringtrain::Error naming the
  // request, the device's free memory, what ringtrain holds, and AllocScope::current().
  void* alloc(size_t bytes);
  void free(void* p);
  AllocatorStats stats() const;
  void release_cached();  // grow: cudaFree the cache

  static size_t round_size(size_t bytes);

 private:
  [[noreturn]] void out_of_memory(size_t bytes, size_t rounded);

  int device_;
  MemoryPolicy policy_;
  cudaStream_t stream_;
  mutable std::mutex mu_;
  AllocatorStats st_;
  std::unordered_map<void*, size_t> live_;  // pointer -> block size
  // grow: cached blocks by size
  std::multimap<size_t, void*> cache_;
  // reserve: the slab and its free ranges (offset -> size), coalesced
  char* slab_ = nullptr;
  size_t slab_bytes_ = 0;
  std::map<size_t, size_t> free_ranges_;
};

}  // namespace ringtrain::kernels::cuda
