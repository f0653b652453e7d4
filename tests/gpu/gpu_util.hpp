// Helpers of the GPU tests (label gpu): whether there is a CUDA device (and the exit status
// that says there is none),
// tensors made on the host and mirrored on the device, read-back as floats, and a
// tolerance check that names the worst element.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain {
inline void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
}  // namespace ringtrain

namespace ringtrain::test {

// The reason there is no usable device, or "" when there is one.
inline const std::string& no_gpu_reason() {
  static const std::string why = [] {
    std::string w;
    if (kernels::cuda::device_count(&w) > 0) return std::string();
    return w.empty() ? std::string("no CUDA device") : w;
  }();
  return why;
}

// The repository whose tests/ref files the suites read: RINGTRAIN_SOURCE_DIR as built, or
// gpu_tests --source-dir=DIR (a bundle from benchmarks/gpu/pack_prebuilt.sh runs where the
// repository lies elsewhere).
inline std::string& source_dir() {
  static std::string dir = RINGTRAIN_SOURCE_DIR;
  return dir;
}

// The exit status of a GPU suite that found no device (ctest's SKIP_RETURN_CODE): the
// suite's main() decides that once, before any test runs, so no failure can look skipped.
constexpr int kNoDeviceExit = 77;

// First statement of every GPU test: a device is there (main() made sure); running without
// one, e.g. under another main(), fails loudly instead of skipping.
#define RT_NEED_GPU()                                                                  \
  do {                                                                                 \
    if (!::ringtrain::test::no_gpu_reason().empty())                                   \
      FAIL() << "no CUDA device (" << ::ringtrain::test::no_gpu_reason()               \
             << "): GPU tests run under gpu_main.cpp, which exits 77 before any test"; \
  } while (0)

// Sets an environment variable for one scope (unset after it).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

inline Device gpu() { return Device{Device::cuda, 0}; }

inline kernels::Backend& gpu_backend() {
  static std::unique_ptr<kernels::Backend> be = kernels::cuda::make_cuda_backend(0);
  return *be;
}
inline kernels::Backend& cpu_backend() {
  static std::unique_ptr<kernels::Backend> be = kernels::make_cpu_backend(1);
  return *be;
}

// A tensor with a host copy and a device copy of the same values.
struct Pair {
  OwnedTensor host, dev;
  const Tensor& h() const { return host.view; }
  const Tensor& d() const { return dev.view; }
  const Tensor* p_h() const { return &host.view; }
  const Tensor* p_d() const { return &dev.view; }
};

inline void store_floats(const Tensor& t, const std::vector<float>& v) {
  if (t.dtype == DType::f32) {
    std::copy(v.begin(), v.end(), t.as<float>());
  } else if (t.dtype == DType::f16 || t.dtype == DType::bf16) {
    kernels::host_from_f32(v.data(), t.data, t.dtype, int64_t(v.size()));
  } else if (t.dtype == DType::i32) {
    for (size_t i = 0; i < v.size(); ++i) t.as<int32_t>()[i] = int32_t(v[i]);
  } else if (t.dtype == DType::u8) {
    for (size_t i = 0; i < v.size(); ++i) t.as<uint8_t>()[i] = uint8_t(v[i]);
  }
}

// Host and device tensors of `shape`/`dtype` holding `values` (rounded to dtype).
inline Pair make_pair(const Shape& shape, DType dtype, const std::vector<float>& values) {
  (void)gpu_backend();  // installs the device-memory hooks
  Pair p;
  p.host.ensure(shape, dtype, Device{});
  p.dev.ensure(shape, dtype, gpu());
  store_floats(p.host.view, values);
  copy_bytes(p.dev.view.data, gpu(), p.host.view.data, Device{}, p.host.view.bytes());
  return p;
}
inline Pair make_pair(const Shape& shape, DType dtype) {
  return make_pair(shape, dtype, std::vector<float>(size_t(shape_numel(shape)), 0.f));
}

inline std::vector<float> uniform(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(gen);
  return v;
}

// Any tensor (host or device, any dtype) as floats on the host.
inline std::vector<float> floats(const Tensor& t) {
  std::vector<char> raw(t.bytes());
  copy_bytes(raw.data(), Device{}, t.data, t.device, t.bytes());
  std::vector<float> out(size_t(t.numel()));
  if (t.dtype == DType::f32 || t.dtype == DType::f16 || t.dtype == DType::bf16) {
    kernels::host_to_f32(raw.data(), t.dtype, out.data(), t.numel());
  } else if (t.dtype == DType::i32) {
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = float(reinterpret_cast<int32_t*>(raw.data())[i]);
  } else if (t.dtype == DType::u8) {
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = float(reinterpret_cast<uint8_t*>(raw.data())[i]);
  }
  return out;
}

// |got - want| <= atol + rtol |want| everywhere; the message names the worst element.
inline ::testing::AssertionResult all_close(const std::vector<float>& got,
                                            const std::vector<float>& want, double rtol,
                                            double atol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size();
  size_t worst = 0, bad = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(want[i]));
    const double lim = atol + rtol * std::fabs(double(want[i]));
    const bool nan_mismatch = std::isnan(got[i]) != std::isnan(want[i]);
    if (nan_mismatch || d > lim) ++bad;
    const double excess = nan_mismatch ? 1e30 : d - lim;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ; worst at index " << worst << ": gpu "
         << got[worst] << " cpu " << want[worst] << " (rtol " << rtol << ", atol " << atol << ")";
}

// Tolerances of a result rounded to `t` from fp32 arithmetic done in another order.
inline double rtol_of(DType t) { return t == DType::f32 ? 1e-5 : t == DType::f16 ? 2e-3 : 1.6e-2; }

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

}  // namespace ringtrain::test
