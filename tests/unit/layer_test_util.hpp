// Helpers of the CNN layer tests (test_cnn.cpp, test_layer_ref.cpp): float views of any
// float tensor, a scalar objective, whole-tensor relative error, and a one-layer Model that
// gives a layer under test its flat parameter store.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/kernels.hpp"
#include "nn/layers.hpp"
#include "nn/model.hpp"
#include "test_util.hpp"

namespace ringtrain::test {

inline std::vector<float> copy_of(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (t.dtype) {
      case DType::f32:
        out[size_t(i)] = t.as<float>()[i];
        break;
      case DType::f16:
        out[size_t(i)] = half_to_float(t.as<uint16_t>()[i]);
        break;
      case DType::bf16:
        out[size_t(i)] = bf16_to_float(t.as<uint16_t>()[i]);
        break;
      default:
        ADD_FAILURE() << "copy_of: not a float tensor";
    }
  }
  return out;
}

inline double dot(const Tensor& y, const std::vector<float>& r) {
  const auto v = copy_of(y);
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += double(v[i]) * r[i];
  return s;
}

// max |a - b| / max |b|: the error of a whole tensor relative to its scale.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - b[i]));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return num / den;
}

// A one-layer Model: the flat parameter store for a layer under test. The Model makes its
// first layer skip the input gradient and its last layer output fp32; the test wants the
// input gradient and the compute dtype, so both are put back.
struct OneLayer {
  OneLayer(std::unique_ptr<Layer> layer, DType compute, uint64_t seed, kernels::Backend& backend) {
    std::vector<std::unique_ptr<Layer>> layers;
    layers.push_back(std::move(layer));
    model = std::make_unique<Model>(std::move(layers), compute);
    model->layers()[0]->set_needs_input_grad(true);
    model->layers()[0]->set_output_dtype(compute);
    model->init_parameters(seed, backend);
    // Random affine parameters too (BatchNorm initialises them to 1 and 0).
    auto v = test::uniform_floats(size_t(model->num_params()), -1.f, 1.f, uint32_t(seed) + 7);
    std::copy(v.begin(), v.end(), model->master().as<float>());
    model->refresh_working_copy(backend);
  }
  Layer& layer() { return *model->layers()[0]; }
  std::unique_ptr<Model> model;
};

}  // namespace ringtrain::test
