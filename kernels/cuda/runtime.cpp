// Per-device runtime, device queries, versions, the check-macro failure paths and the
// device-memory hooks that make Buffer(bytes, Device{cuda, i}) work (see runtime.hpp).
#include "kernels/cuda/runtime.hpp"

#include <nccl.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>

#include "core/env.hpp"
#include "core/tensor.hpp"

namespace ringtrain::kernels::cuda {

// ---- errors -------------------------------------------------------------------------

std::string where_am_i() {
  const char* rank = nullptr;
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if ((rank = std::getenv(v))) break;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) (void)cudaGetLastError();
  return cat("rank ", rank ? rank : "?", " on ", host, ", cuda:", dev);
}

void fail_cuda(const char* file, int line, const char* stmt, cudaError_t e) {
  throw_runtime(
      file, line,
      cat(where_am_i(), ": ", stmt, " failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

void fail_cublas(const char* file, int line, const char* stmt, cublasStatus_t s) {
  throw_runtime(file, line,
                cat(where_am_i(), ": ", stmt, " failed: ", cublasGetStatusName(s), ": ",
                    cublasGetStatusString(s)));
}

void fail_cudnn(const char* file, int line, const char* stmt, int status) {
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  throw_runtime(file, line,
                cat(where_am_i(), ": ", stmt, " failed: ",
                    cudnnGetErrorString(cudnnStatus_t(status)), last[0] ? ": " : "", last));
}

// ---- environment ----------------------------------------------------------------------

const CudaEnv& cuda_env() { return mutable_cuda_env(); }
void set_tf32(bool on) { mutable_cuda_env().tf32 = on; }
bool tf32() { return cuda_env().tf32; }

CudaEnv& mutable_cuda_env() {
  static CudaEnv env = [] {
    CudaEnv e;
    e.tf32 = ::ringtrain::env::cuda_tf32();
    e.gemm_ex = ::ringtrain::env::cuda_gemm() == "gemmex";
    e.gemm_workspace = size_t(::ringtrain::env::cuda_gemm_workspace_mb()) << 20;
    e.conv_workspace = size_t(::ringtrain::env::cuda_conv_workspace_mb()) << 20;
    return e;
  }();
  return env;
}

// ---- devices ------------------------------------------------------------------------

bool built() { return true; }

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)";
  return n;
}

int device_for_local_rank(int local_rank) {
  std::string why;
  const int n = device_count(&why);
  RT_REQUIRE(n > 0, "--device cuda: no usable CUDA device on this node (", why, ")");
  return n == 1 ? 0 : local_rank % n;
}

DeviceInfo device_info(int index) {
  std::string why;
  const int n = device_count(&why);
  RT_REQUIRE(index >= 0 && index < n, "cuda:", index,
             " is not available: ", n == 0 ? why : cat(n, " device(s) visible"));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  DeviceInfo d;
  d.index = index;
  d.name = prop.name;
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  d.multiprocessors = prop.multiProcessorCount;
  d.total_bytes = prop.totalGlobalMem;
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, index) == cudaSuccess) d.pci_bus_id = bus;
  CUDA_CHECK(cudaDriverGetVersion(&d.driver_version));
  CUDA_CHECK(cudaRuntimeGetVersion(&d.runtime_version));
  int cur = 0;
  CUDA_CHECK(cudaGetDevice(&cur));
  CUDA_CHECK(cudaSetDevice(index));
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  CUDA_CHECK(cudaSetDevice(cur));
  d.free_bytes = free_b;
  return d;
}

std::string library_versions() {
  auto ver = [](int v) { return cat(v / 1000, ".", v % 1000 / 10); };
  int rt = 0, drv = 0;
  std::string out = cat("toolkit ", CUDART_VERSION / 1000, ".", CUDART_VERSION % 1000 / 10);
  if (cudaRuntimeGetVersion(&rt) == cudaSuccess) out += cat(", runtime ", ver(rt));
  if (cudaDriverGetVersion(&drv) == cudaSuccess)
    out += drv ? cat(", driver ", ver(drv)) : std::string(", no driver");
  (void)cudaGetLastError();
  const size_t lt = cublasLtGetVersion();
  out += cat("; cuBLASLt ", lt / 10000, ".", lt / 100 % 100, ".", lt % 100);
  const size_t dnn = cudnnGetVersion();
  out += cat("; cuDNN ", dnn / 10000, ".", dnn / 100 % 100, ".", dnn % 100);
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess)
    out += cat("; NCCL ", nccl / 10000, ".", nccl / 100 % 100, ".", nccl % 100);
  return out;
}

// ---- runtime ----------------------------------------------------------------------------

DeviceRuntime::DeviceRuntime(int index, const MemoryPolicy& policy)
    : index_(index), policy_(policy), info_(device_info(index)) {
  make_current();
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&cublas_));
  CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  CUBLAS_CHECK(cublasLtCreate(&lt_));
  CUDA_CHECK(cudaMallocHost(&pinned_, kPinnedBytes));
  allocator_ = std::make_unique<Allocator>(index, policy, stream_);
}

DeviceRuntime::~DeviceRuntime() {
  // Runtimes live until exit; the driver may be shutting down, so errors are ignored.
  allocator_.reset();
  if (cudnn_) cudnnDestroy(cudnn_);
  if (lt_) cublasLtDestroy(lt_);
  if (cublas_) cublasDestroy(cublas_);
  if (pinned_) cudaFreeHost(pinned_);
  if (stream_) cudaStreamDestroy(stream_);
}

void DeviceRuntime::make_current() const { CUDA_CHECK(cudaSetDevice(index_)); }

cudnnHandle_t DeviceRuntime::cudnn() {
  std::lock_guard<std::mutex> lock(cudnn_mu_);
  if (!cudnn_) {
    make_current();
    CUDNN_CHECK(cudnnCreate(&cudnn_));
    CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
  }
  return cudnn_;
}

namespace {

constexpr int kMaxDevices = 64;
std::mutex g_mu;
std::array<std::unique_ptr<DeviceRuntime>, kMaxDevices>& runtimes() {
  // Leaked on purpose: destroying CUDA objects from static destructors races the driver's
  // own shutdown; the process exit frees everything.
  static auto* all = new std::array<std::unique_ptr<DeviceRuntime>, kMaxDevices>();
  return *all;
}

void* hook_alloc(size_t bytes, int device) {
  DeviceRuntime& rt = runtime(device);
  rt.make_current();
  return rt.allocator().alloc(bytes);
}

void hook_free(void* p, size_t, int device) {
  auto& all = runtimes();
  if (device < 0 || device >= kMaxDevices || !all[size_t(device)]) return;
  all[size_t(device)]->allocator().free(p);
}

void hook_copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) {
  const int device = dd.kind == Device::cuda ? dd.index : sd.index;
  DeviceRuntime& rt = runtime(device);
  rt.make_current();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, rt.stream()));
  CUDA_CHECK(cudaStreamSynchronize(rt.stream()));
}

const DeviceMemoryHooks kHooks{&hook_alloc, &hook_free, &hook_copy};

}  // namespace

DeviceRuntime& runtime(int index, const MemoryPolicy* policy) {
  std::lock_guard<std::mutex> lock(g_mu);
  RT_REQUIRE(index >= 0 && index < kMaxDevices, "cuda:", index, " is not a valid device index");
  auto& slot = runtimes()[size_t(index)];
  if (!slot) {
    slot = std::make_unique<DeviceRuntime>(index, policy ? *policy : MemoryPolicy{});
    set_device_memory_hooks(&kHooks);
  } else if (policy) {
    RT_REQUIRE(
        policy->reserve == slot->policy().reserve && policy->fraction == slot->policy().fraction,
        "cuda:", index, " already runs with --gpu-memory ", slot->policy().str(),
        "; it cannot change to ", policy->str(), " in the same process");
  }
  return *slot;
}

AllocatorStats allocator_stats(int index) { return runtime(index).allocator().stats(); }
void release_cached_memory(int index) { runtime(index).allocator().release_cached(); }
void synchronize(int index) {
  DeviceRuntime& rt = runtime(index);
  rt.make_current();
  CUDA_CHECK(cudaStreamSynchronize(rt.stream()));
}
void* compute_stream(int index) { return runtime(index).stream(); }
void queue_cast(Backend& be, int index, const Tensor& src, const Tensor& dst) {
  runtime(index).make_current();
  be.cast(src, dst);
}

void copy_tensor(const Tensor& dst, const Tensor& src) {
  RT_CHECK(dst.bytes() == src.bytes(), "copy of ", src.bytes(), " bytes into ", dst.bytes());
  copy_bytes(dst.data, dst.device, src.data, src.device, src.bytes());
}

}  // namespace ringtrain::kernels::cuda
