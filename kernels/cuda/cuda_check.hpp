// CUDA_CHECK, CUBLAS_CHECK, CUDNN_CHECK: wrap every CUDA-library call; on failure throw
// ringtrain::Error with the rank and host (from the launcher's environment: kernels does not
// depend on MPI), file:line, the statement and the library's own error string (for cuDNN
// also cudnnGetLastErrorString). CUDA_CHECK_LAUNCH() after every kernel launch.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.hpp"

namespace ringtrain::kernels::cuda {

// "rank 3 on node07 (cuda:0)": the launcher's rank variables and the host name.
std::string where_am_i();
[[noreturn]] void fail_cuda(const char* file, int line, const char* stmt, cudaError_t e);
[[noreturn]] void fail_cublas(const char* file, int line, const char* stmt, cublasStatus_t s);
[[noreturn]] void fail_cudnn(const char* file, int line, const char* stmt, int status);

}  // namespace ringtrain::kernels::cuda

#define CUDA_CHECK(stmt)                                                            \
  do {                                                                              \
    cudaError_t rt_cuda_e_ = (stmt);                                                \
    if (rt_cuda_e_ != cudaSuccess)                                                  \
      ::ringtrain::kernels::cuda::fail_cuda(__FILE__, __LINE__, #stmt, rt_cuda_e_); \
  } while (0)

// After each <<<...>>>: a bad launch configuration shows up here, not at the next sync.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(stmt)                                                              \
  do {                                                                                  \
    cublasStatus_t rt_cublas_s_ = (stmt);                                               \
    if (rt_cublas_s_ != CUBLAS_STATUS_SUCCESS)                                          \
      ::ringtrain::kernels::cuda::fail_cublas(__FILE__, __LINE__, #stmt, rt_cublas_s_); \
  } while (0)

#define CUDNN_CHECK(stmt)                                                             \
  do {                                                                                \
    int rt_cudnn_s_ = int(stmt);                                                      \
    if (rt_cudnn_s_ != 0) /* CUDNN_STATUS_SUCCESS */                                  \
      ::ringtrain::kernels::cuda::fail_cudnn(__FILE__, __LINE__, #stmt, rt_cudnn_s_); \
  } while (0)
