// Convolution through oneDNN, the CPU backend's alternative to im2col + OpenBLAS (chosen with
// RINGTRAIN_CONV=onednn|im2col; benchmarks/conv_bench measures both). Tensors in NCHW
// (activations) and OIHW (filters), like the rest of the CPU backend; inputs in fp32 or, where
// oneDNN has kernels for it (supports()), bf16 / fp16 with fp32 accumulation.
#pragma once

#include <memory>
#include <string>

#include "kernels/kernels.hpp"

namespace ringtrain::kernels::cpu {

class OneDnnConv {
 public:
  OneDnnConv();
  ~OneDnnConv();
  // True when oneDNN has optimised (not reference) convolutions with inputs of dtype `in`.
  bool supports(DType in);
  // y = act(conv(x, w) + bias); x and w of dtype `in`, y of dtype `out` (fp32 or `in`);
  // bias (fp32) may be null.
  void forward(const ConvShape& cs, const void* x, const void* w, DType in, const float* bias,
               bool relu, void* y, DType out);
  // dx (dtype `out`: fp32 or `in`) from dy and w of dtype `in`.
  void backward_data(const ConvShape& cs, const void* dy, const void* w, DType in, void* dx,
                     DType out);
  // dw (and db when not null), fp32, overwritten; x and dy of dtype `in`.
  void backward_weights(const ConvShape& cs, const void* x, const void* dy, DType in, float* dw,
                        float* db);
  static std::string version();  // "oneDNN 2.6.3"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringtrain::kernels::cpu
