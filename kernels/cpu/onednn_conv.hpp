// Convolution through oneDNN, the CPU backend's alternative to im2col + OpenBLAS (chosen with
// RINGTRAIN_CONV=onednn|im2col; benchmarks/conv_bench measures both). Activations in NCHW or
// the layouts of ConvShape (kernels::Layout), filters in OIHW, in any float dtype; the
// arithmetic in fp32 or, where oneDNN has kernels for it (supports()), on bf16 / fp16 inputs
// with fp32 accumulation.
#pragma once

#include <memory>
#include <string>

#include "kernels/kernels.hpp"

namespace ringtrain::kernels::cpu {

class OneDnnConv {
 public:
  // winograd: 3x3 stride-1 fp32 convolutions of 16+ channels by Winograd where oneDNN has it.
  explicit OneDnnConv(bool winograd = true);
  ~OneDnnConv();
  // True when oneDNN has optimised (not reference) convolutions with inputs of dtype `in`.
  bool supports(DType in);
  // Each pointer comes with its tensor's dtype; `compute` is the dtype the convolution reads
  // (fp32, or a 16-bit dtype supports() accepts). A tensor whose dtype or layout differs
  // from what the primitive wants is converted by the reorder into (or out of) oneDNN's
  // layout, in the same pass: widening a bf16 tensor costs no pass of its own (oneDNN 2.6
  // converts fp16 only in its reference reorder, so the CPU backend widens fp16 itself).
  // y = act(conv(x, w) + bias), rounded once to y's dtype; bias (fp32) may be null.
  void forward(const ConvShape& cs, DType compute, const void* x, DType xt, const void* w, DType wt,
               const float* bias, bool relu, void* y, DType yt);
  // dx from dy and w.
  void backward_data(const ConvShape& cs, DType compute, const void* dy, DType dyt, const void* w,
                     DType wt, void* dx, DType dxt);
  // dw (and db when not null), fp32, overwritten.
  void backward_weights(const ConvShape& cs, DType compute, const void* x, DType xt, const void* dy,
                        DType dyt, float* dw, float* db);
  // Both: backward_weights, then backward_data when dx is not null, reading dy in oneDNN's
  // layout once when both primitives want the same one.
  void backward(const ConvShape& cs, DType compute, const void* x, DType xt, const void* dy,
                DType dyt, const void* w, DType wt, void* dx, DType dxt, float* dw, float* db);
  // dst = src, an activation [n, c, h, w] of dtype t, from one layout into another (a JIT
  // reorder; the max pooling of a blocked input makes its plain output with it).
  void reorder(int64_t n, int64_t c, int64_t h, int64_t w, DType t, const void* src, Layout from,
               void* dst, Layout to);
  static std::string version();  // "oneDNN 2.6.3"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringtrain::kernels::cpu
