// Convolution through oneDNN, the CPU backend's alternative to im2col + OpenBLAS (chosen with
// RINGTRAIN_CONV=onednn|im2col; benchmarks/conv_bench measures both). fp32 tensors in NCHW
// (activations) and OIHW (filters), like the rest of the CPU backend.
#pragma once

#include <memory>
#include <string>

#include "kernels/kernels.hpp"

namespace ringtrain::kernels::cpu {

class OneDnnConv {
 public:
  OneDnnConv();
  ~OneDnnConv();
  // y = act(conv(x, w) + bias); bias may be null.
  void forward(const ConvShape& cs, const float* x, const float* w, const float* bias, bool relu,
               float* y);
  void backward_data(const ConvShape& cs, const float* dy, const float* w, float* dx);
  // dw (and db when not null), overwritten.
  void backward_weights(const ConvShape& cs, const float* x, const float* dy, float* dw, float* db);
  static std::string version();  // "oneDNN 2.6.3"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringtrain::kernels::cpu
