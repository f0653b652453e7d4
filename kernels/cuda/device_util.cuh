// Device-side helpers of our kernels: typed loads/stores between fp32 and the storage
// dtypes (round to nearest even, as the CPU reference), dtype dispatch on the host, and the
// launch shape of a 1-D elementwise kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace ringtrain::kernels::cuda {

__device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void st(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

template <typename T>
struct Tag {
  using type = T;
};

// f(Tag<storage>{}) for a float dtype.
template <typename F>
void dispatch(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(Tag<float>{});
    case DType::f16:
      return f(Tag<__half>{});
    case DType::bf16:
      return f(Tag<__nv_bfloat16>{});
    default:
      break;
  }
  throw_runtime(__FILE__, __LINE__, cat("a float dtype was expected, got ", dtype_name(t)));
}

constexpr int kThreads = 256;
// Blocks for n elements, one element per thread (kernels still loop, grid-stride, so any n
// is covered).
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(std::clamp<int64_t>(b, 1, int64_t(1) << 30));
}

#define RT_GRID_STRIDE(i, n)                                                \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

}  // namespace ringtrain::kernels::cuda
