// The caching device allocator: a freed block is handed out again without cudaMalloc,
// memory comes zero-filled, the reserve policy sub-allocates one block and coalesces, and
// an out-of-memory error says what was asked, what is free and which layer asked.
#include "kernels/cuda/allocator.hpp"

#include <cuda_runtime.h>

#include "tests/gpu/gpu_util.hpp"

namespace ringtrain::test {
namespace {

TEST(Allocator, ReusesFreedBlocks) {
  RT_NEED_GPU();
  (void)gpu_backend();
  void* first = nullptr;
  {
    Buffer b(3 << 20, gpu());
    first = b.data();
    std::vector<float> ones(size_t(3 << 18), 1.f);
    copy_bytes(b.data(), gpu(), ones.data(), Device{}, ones.size() * 4);
  }
  const auto before = kernels::cuda::allocator_stats(0);
  Buffer again(3 << 20, gpu());
  const auto after = kernels::cuda::allocator_stats(0);
  EXPECT_EQ(again.data(), first) << "the cached block was not reused";
  EXPECT_EQ(after.device_mallocs, before.device_mallocs) << "cudaMalloc was called again";
  EXPECT_EQ(after.cache_hits, before.cache_hits + 1);
  // Reused memory is zero-filled like a fresh host Buffer.
  std::vector<float> back(size_t(3 << 18), -1.f);
  copy_bytes(back.data(), Device{}, again.data(), gpu(), back.size() * 4);
  EXPECT_EQ(max_abs(back), 0.0);
}

TEST(Allocator, OutOfMemoryNamesRequestFreeAndLayer) {
  RT_NEED_GPU();
  (void)gpu_backend();
  const auto info = kernels::cuda::device_info(0);
  AllocScope scope("layer fc9");
  try {
    Buffer huge(info.total_bytes * 2, gpu());
    FAIL() << "allocating twice the device's memory succeeded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out of GPU memory on cuda:0"), std::string::npos) << m;
    EXPECT_NE(m.find("layer fc9"), std::string::npos) << m;
    EXPECT_NE(m.find("asked for"), std::string::npos) << m;
    EXPECT_NE(m.find("free of"), std::string::npos) << m;
    EXPECT_NE(m.find("--batch-size"), std::string::npos) << m;
  }
  Buffer small(1 << 20, gpu());  // still usable afterwards
  EXPECT_NE(small.data(), nullptr);
}

TEST(Allocator, ReservePolicySubAllocatesAndCoalesces) {
  RT_NEED_GPU();
  (void)gpu_backend();
  kernels::cuda::MemoryPolicy policy = kernels::cuda::MemoryPolicy::parse("reserve:0.02");
  cudaStream_t stream = static_cast<cudaStream_t>(kernels::cuda::compute_stream(0));
  kernels::cuda::Allocator a(0, policy, stream);
  const auto s0 = a.stats();
  EXPECT_GT(s0.reserved, size_t(0));
  EXPECT_EQ(s0.device_mallocs, 1);
  const size_t quarter = s0.reserved / 4 / (2 << 20) * (2 << 20);
  void* p1 = a.alloc(quarter);
  void* p2 = a.alloc(quarter);
  void* p3 = a.alloc(quarter);
  a.free(p1);
  a.free(p2);
  // p1 and p2 merged: a block of two quarters fits where they were.
  void* big = a.alloc(2 * quarter);
  EXPECT_EQ(big, p1);
  EXPECT_EQ(a.stats().device_mallocs, 1);
  try {
    a.alloc(s0.reserved);
    FAIL() << "the reserve handed out more than it holds";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reserve"), std::string::npos) << e.what();
  }
  a.free(big);
  a.free(p3);
  EXPECT_EQ(a.stats().in_use, size_t(0));
  cudaStreamSynchronize(stream);
}

TEST(MemoryPolicy, Parses) {  // runs without a GPU too
  EXPECT_FALSE(kernels::cuda::MemoryPolicy::parse("grow").reserve);
  const auto r = kernels::cuda::MemoryPolicy::parse("reserve:0.5");
  EXPECT_TRUE(r.reserve);
  EXPECT_DOUBLE_EQ(r.fraction, 0.5);
  EXPECT_EQ(r.str(), "reserve:0.5");
  for (const char* bad : {"reserve:", "reserve:0", "reserve:1.5", "reserve:x", "all"}) {
    try {
      kernels::cuda::MemoryPolicy::parse(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::input) << bad;
      EXPECT_NE(std::string(e.what()).find("--gpu-memory"), std::string::npos) << e.what();
    }
  }
}

TEST(DeviceInfo, PrecisionWarningsAndDescription) {  // runs without a GPU too
  kernels::cuda::DeviceInfo v100;
  v100.name = "Tesla V100";
  v100.cc_major = 7;
  EXPECT_EQ(kernels::cuda::precision_warning(v100, DType::f16), "");
  EXPECT_NE(kernels::cuda::precision_warning(v100, DType::bf16).find("8.0"), std::string::npos);
  kernels::cuda::DeviceInfo p100 = v100;
  p100.cc_major = 6;
  EXPECT_NE(kernels::cuda::precision_warning(p100, DType::f16).find("7.0"), std::string::npos);
  kernels::cuda::DeviceInfo h200;
  h200.name = "NVIDIA H200", h200.cc_major = 9, h200.total_bytes = size_t(141) << 30;
  h200.driver_version = 12080, h200.runtime_version = 13000;
  EXPECT_EQ(kernels::cuda::precision_warning(h200, DType::bf16), "");
  const std::string d = kernels::cuda::describe(h200);
  EXPECT_NE(d.find("NVIDIA H200, 141.0 GiB"), std::string::npos) << d;
  EXPECT_NE(d.find("compute capability 9.0, driver 12.8, runtime 13.0"), std::string::npos) << d;
}

}  // namespace
}  // namespace ringtrain::test
