// DeviceRuntime: what one process holds per GPU and every CudaBackend on it shares — the
// compute stream, the cuBLAS(Lt) and cuDNN handles, the caching allocator, pinned host
// words for results read back (flags, loss rows) — created on first use of the device.
// Internal to kernels/cuda and comm/nccl.
#pragma once

#include <cudnn.h>

#include <memory>
#include <mutex>

#include "kernels/cuda/allocator.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace ringtrain::kernels::cuda {

class DeviceRuntime {
 public:
  DeviceRuntime(int index, const MemoryPolicy& policy);
  ~DeviceRuntime();
  DeviceRuntime(const DeviceRuntime&) = delete;
  DeviceRuntime& operator=(const DeviceRuntime&) = delete;

  int index() const { return index_; }
  const DeviceInfo& info() const { return info_; }
  const MemoryPolicy& policy() const { return policy_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  cublasLtHandle_t lt() const { return lt_; }
  cudnnHandle_t cudnn();  // created on first use (it loads the cuDNN sub-libraries)
  Allocator& allocator() { return *allocator_; }
  // Makes this thread's current device this one (cudaSetDevice is per thread).
  void make_current() const;
  // Pinned host memory for small read-backs, `bytes` at most kPinnedBytes.
  static constexpr size_t kPinnedBytes = 1 << 20;
  void* pinned() const { return pinned_; }

 private:
  int index_;
  MemoryPolicy policy_;
  DeviceInfo info_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  std::mutex cudnn_mu_;
  std::unique_ptr<Allocator> allocator_;
  void* pinned_ = nullptr;
};

// The runtime of device `index`, created with `policy` on first use (input error when a
// later call asks for another policy, or when there is no such device).
DeviceRuntime& runtime(int index, const MemoryPolicy* policy = nullptr);

// Environment tunables of the CUDA backend, read once (style.md: one table).
struct CudaEnv {
  bool tf32 = false;          // RINGTRAIN_CUDA_TF32=1: fp32 GEMM/convolution on TF32 tensor cores
  bool gemm_ex = false;       // RINGTRAIN_CUDA_GEMM=gemmex: cublasGemmEx instead of cuBLASLt
  size_t gemm_workspace = 0;  // bytes: RINGTRAIN_CUDA_GEMM_WORKSPACE_MB
  size_t conv_workspace = 0;  // bytes: RINGTRAIN_CUDA_CONV_WORKSPACE_MB, cap per convolution
};
const CudaEnv& cuda_env();
CudaEnv& mutable_cuda_env();  // set_tf32()

}  // namespace ringtrain::kernels::cuda
