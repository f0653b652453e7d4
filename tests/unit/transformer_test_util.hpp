// Helpers of the CPU transformer-op tests (test_transformer_ops.cpp, test_attention.cpp): a
// CPU backend, host tensors filled from floats in any dtype, rounding through a 16-bit dtype,
// and the central finite-difference check with its fp32 tolerances.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/kernels.hpp"
#include "layer_test_util.hpp"
#include "test_util.hpp"

namespace ringtrain::test {

constexpr double kRtol = 2e-2, kAtol = 2e-3;  // finite differences in fp32 (as test_cnn.cpp)

inline std::unique_ptr<kernels::Backend> backend(int threads = 1) {
  return kernels::make_cpu_backend(threads);
}

// A host tensor that owns its memory, filled from floats (rounded to its dtype).
struct Host {
  OwnedTensor o;
  Host(Shape s, DType t, const std::vector<float>& v = {}) {
    o.ensure(s, t, Device{});
    if (!v.empty()) set(v);
  }
  void set(const std::vector<float>& v) {
    static const auto caster = backend();
    Tensor src(const_cast<float*>(v.data()), o.view.shape, DType::f32);
    caster->cast(src, o.view);
  }
  const Tensor& t() const { return o.view; }
  const Tensor* p() const { return &o.view; }
  std::vector<float> get() const { return copy_of(o.view); }
};

// max |got - want| / max |want|: an fp32 result's error against a double reference.
inline double rel_err_d(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::fabs(double(got[i]) - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return num / den;
}

// Round floats through a 16-bit dtype (so fp32 and 16-bit runs see the same inputs).
inline std::vector<float> rounded(const std::vector<float>& v, DType t) {
  Host h({int64_t(v.size())}, t, v);
  return h.get();
}

inline double weighted(const std::vector<float>& y, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += double(y[i]) * r[i];
  return s;
}

// Central differences of loss() in v[i] against grad[i], for a spread of indices.
inline void check_fd(const std::string& what, std::vector<float>& v, const std::vector<float>& grad,
                     const std::function<double()>& loss, float eps = 1e-2f,
                     size_t max_checks = 60) {
  const size_t step = std::max<size_t>(1, v.size() / max_checks);
  for (size_t i = 0; i < v.size(); i += step) {
    const float keep = v[i];
    v[i] = keep + eps;
    const double up = loss();
    v[i] = keep - eps;
    const double down = loss();
    v[i] = keep;
    const double fd = (up - down) / (2.0 * eps);
    EXPECT_TRUE(close(grad[i], fd, kRtol, kAtol))
        << what << " at index " << i << ": backward " << grad[i] << ", finite difference " << fd;
  }
}

}  // namespace ringtrain::test
