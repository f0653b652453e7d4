// The caching device allocator (see allocator.hpp).
#include "kernels/cuda/allocator.hpp"

#include <cmath>

#include "core/tensor.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace ringtrain::kernels::cuda {
namespace {

constexpr size_t kSmallStep = 512, kLargeStep = 2 << 20, kLargeFrom = 1 << 20;

std::string gib(size_t bytes) {
  char buf[32];
  if (bytes >= (size_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1 << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1 << 20));
  return buf;
}

}  // namespace

size_t Allocator::round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t step = bytes < kLargeFrom ? kSmallStep : kLargeStep;
  return (bytes + step - 1) / step * step;
}

Allocator::Allocator(int device, const MemoryPolicy& policy, cudaStream_t stream)
    : device_(device), policy_(policy), stream_(stream) {
  if (!policy_.reserve) return;
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  slab_bytes_ = size_t(double(total_b) * policy_.fraction) / kLargeStep * kLargeStep;
  RT_REQUIRE(slab_bytes_ > 0 && slab_bytes_ <= free_b, "--gpu-memory ", policy_.str(), " asks for ",
             gib(slab_bytes_), " of cuda:", device, ", but ", gib(free_b), " of ", gib(total_b),
             " are free; use a smaller fraction or --gpu-memory grow");
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, slab_bytes_));
  slab_ = static_cast<char*>(p);
  free_ranges_[0] = slab_bytes_;
  st_.reserved = slab_bytes_;
  st_.cached = slab_bytes_;
  st_.device_mallocs = 1;
}

Allocator::~Allocator() {
  // At process exit the driver may already be gone; errors are ignored here.
  for (auto& [size, p] : cache_) cudaFree(p);
  for (auto& [p, size] : live_)
    if (!slab_) cudaFree(p);
  if (slab_) cudaFree(slab_);
}

void* Allocator::alloc(size_t bytes) {
  const size_t rounded = round_size(bytes);
  std::unique_lock<std::mutex> lock(mu_);
  void* p = nullptr;
  if (policy_.reserve) {
    // Best fit among the free ranges.
    auto best = free_ranges_.end();
    for (auto it = free_ranges_.begin(); it != free_ranges_.end(); ++it)
      if (it->second >= rounded && (best == free_ranges_.end() || it->second < best->second))
        best = it;
    if (best == free_ranges_.end()) out_of_memory(bytes, rounded);
    const size_t off = best->first, size = best->second;
    free_ranges_.erase(best);
    if (size > rounded) free_ranges_[off + rounded] = size - rounded;
    p = slab_ + off;
    ++st_.cache_hits;
    st_.cached -= rounded;
  } else {
    // The smallest cached block that fits and wastes at most half of itself.
    auto it = cache_.lower_bound(rounded);
    if (it != cache_.end() && it->first <= 2 * rounded) {
      p = it->second;
      const size_t size = it->first;
      cache_.erase(it);
      st_.cached -= size;
      ++st_.cache_hits;
      live_[p] = size;
      st_.in_use += size;
      st_.peak_in_use = std::max(st_.peak_in_use, st_.in_use);
      lock.unlock();
      CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
      return p;
    }
    cudaError_t e = cudaMalloc(&p, rounded);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the sticky-free error state of the runtime API
      lock.unlock();
      release_cached();
      lock.lock();
      e = cudaMalloc(&p, rounded);
      if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        out_of_memory(bytes, rounded);
      }
    }
    CUDA_CHECK(e);
    ++st_.device_mallocs;
    st_.reserved += rounded;
  }
  live_[p] = rounded;
  st_.in_use += rounded;
  st_.peak_in_use = std::max(st_.peak_in_use, st_.in_use);
  lock.unlock();
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  return p;
}

void Allocator::free(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return;  // not ours (cannot happen through Buffer)
  const size_t size = it->second;
  live_.erase(it);
  st_.in_use -= size;
  st_.cached += size;
  if (!policy_.reserve) {
    cache_.emplace(size, p);
    return;
  }
  // Return the range and merge it with its free neighbours.
  size_t off = size_t(static_cast<char*>(p) - slab_), len = size;
  auto next = free_ranges_.lower_bound(off);
  if (next != free_ranges_.end() && off + len == next->first) {
    len += next->second;
    next = free_ranges_.erase(next);
  }
  if (next != free_ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return;
    }
  }
  free_ranges_[off] = len;
}

AllocatorStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return st_;
}

void Allocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  if (policy_.reserve || cache_.empty()) return;
  // Blocks in the cache may still be read by queued work on the stream.
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (auto& [size, p] : cache_) {
    CUDA_CHECK(cudaFree(p));
    st_.reserved -= size;
    st_.cached -= size;
  }
  cache_.clear();
}

void Allocator::out_of_memory(size_t bytes, size_t rounded) {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
  const std::string& who = AllocScope::current();
  throw_runtime(
      __FILE__, __LINE__,
      cat("out of GPU memory on cuda:", device_, " (", where_am_i(), ")",
          who.empty() ? std::string() : cat(" in ", who), ": asked for ", gib(bytes), " (", rounded,
          " bytes rounded); the device has ", gib(free_b), " free of ", gib(total_b),
          "; ringtrain holds ", gib(st_.reserved), " (", gib(st_.in_use), " in use, ",
          gib(st_.cached), policy_.reserve ? " free in the reserve" : " cached", ", peak ",
          gib(st_.peak_in_use), ") under --gpu-memory ", policy_.str(),
          policy_.reserve ? "; reserve a larger fraction, or use a smaller --batch-size"
                          : "; use a smaller --batch-size (or a smaller model)"));
}

}  // namespace ringtrain::kernels::cuda
