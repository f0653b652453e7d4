// Shared by gpu_bench's sections: error checks that exit (the benchmark reports a CUDA
// error as exit 2), event timing on the compute stream, and host <-> device fills.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/tensor.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain::gpubench {

using Clock = std::chrono::steady_clock;

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)
#define CHECK_CUBLAS(x)                                                                           \
  do {                                                                                            \
    cublasStatus_t s_ = (x);                                                                      \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasGetStatusString(s_)); \
      std::exit(2);                                                                               \
    }                                                                                             \
  } while (0)

inline const Device kGpu{Device::cuda, 0};

inline cudaDataType_t cuda_type(DType t) {
  return t == DType::f32 ? CUDA_R_32F : t == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
}

// Seconds per call of f, timed with events on the compute stream after warm-up.
template <typename F>
double time_it(cudaStream_t s, int warmup, int iters, F f) {
  for (int i = 0; i < warmup; ++i) f();
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  CHECK_CUDA(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) f();
  CHECK_CUDA(cudaEventRecord(b, s));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms) / 1e3 / iters;
}

inline void fill_uniform(const Tensor& t, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (auto& x : v) x = 2.f * rng.uniform() - 1.f;
  std::vector<char> raw(t.bytes());
  if (t.dtype == DType::f32)
    std::memcpy(raw.data(), v.data(), raw.size());
  else
    kernels::host_from_f32(v.data(), raw.data(), t.dtype, t.numel());
  copy_bytes(t.data, kGpu, raw.data(), Device{}, raw.size());
}

inline std::vector<float> download(const Tensor& t) {
  std::vector<char> raw(t.bytes());
  copy_bytes(raw.data(), Device{}, t.data, kGpu, raw.size());
  std::vector<float> v(static_cast<size_t>(t.numel()));
  kernels::host_to_f32(raw.data(), t.dtype, v.data(), t.numel());
  return v;
}

}  // namespace ringtrain::gpubench
