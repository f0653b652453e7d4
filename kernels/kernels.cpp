// Backend-neutral helpers of the kernels layer.
#include "kernels/kernels.hpp"

#include "core/error.hpp"

namespace ringtrain::kernels {

void check_conv_shapes(const ConvShape& cs, const Tensor& x, const Tensor& w, const Tensor& y) {
  RT_CHECK(cs.n > 0 && cs.c > 0 && cs.h > 0 && cs.w > 0 && cs.k > 0 && cs.r > 0 && cs.s > 0 &&
               cs.stride > 0 && cs.pad >= 0 && cs.p() > 0 && cs.q() > 0,
           "convolution shape is not valid: input [", cs.n, ", ", cs.c, ", ", cs.h, ", ", cs.w,
           "], filter [", cs.k, ", ", cs.c, ", ", cs.r, ", ", cs.s, "], stride ", cs.stride,
           ", padding ", cs.pad);
  RT_CHECK(x.numel() == cs.n * cs.c * cs.h * cs.w, "convolution input has ", x.numel(),
           " elements, expected ", cs.n * cs.c * cs.h * cs.w);
  RT_CHECK(w.numel() == cs.k * cs.c * cs.r * cs.s, "convolution filter has ", w.numel(),
           " elements, expected ", cs.k * cs.c * cs.r * cs.s);
  RT_CHECK(y.numel() == cs.n * cs.k * cs.p() * cs.q(), "convolution output has ", y.numel(),
           " elements, expected ", cs.n * cs.k * cs.p() * cs.q());
}

void check_pool_shapes(const PoolShape& ps, const Tensor& x, const Tensor& y,
                       const Tensor& argmax) {
  const int64_t planes = ps.n * ps.c;
  RT_CHECK(ps.kernel > 0 && ps.stride > 0 && ps.p() > 0 && ps.q() > 0 &&
               x.numel() == planes * ps.h * ps.w && y.numel() == planes * ps.p() * ps.q() &&
               argmax.numel() == y.numel() && argmax.dtype == DType::i32 && x.dtype == y.dtype,
           "max pooling shapes do not match: x ", shape_str(x.shape), " y ", shape_str(y.shape),
           " kernel ", ps.kernel, " stride ", ps.stride);
}

NchwDims batchnorm_dims(const Tensor& x, const Tensor& gamma) {
  RT_CHECK(x.shape.size() >= 2, "batch norm takes [N, C, ...], got ", shape_str(x.shape));
  NchwDims d{x.dim(0), x.dim(1), 1};
  for (size_t i = 2; i < x.shape.size(); ++i) d.hw *= x.dim(i);
  RT_CHECK(gamma.numel() == d.c && gamma.dtype == DType::f32, "batch norm of ", d.c,
           " channels got fp32 parameters of ", gamma.numel());
  return d;
}

const char* op_name(Op op) {
  switch (op) {
    case Op::gemm:
      return "gemm";
    case Op::cast:
      return "cast";
    case Op::bias_add:
      return "bias_add";
    case Op::bias_grad:
      return "bias_grad";
    case Op::relu:
      return "relu";
    case Op::relu_backward:
      return "relu_backward";
    case Op::softmax_xent:
      return "softmax_xent";
    case Op::unscale_check:
      return "unscale_check";
    case Op::any_nonfinite:
      return "any_nonfinite";
    case Op::sum_squares:
      return "sum_squares";
    case Op::scale:
      return "scale";
    case Op::sgd_step:
      return "sgd_step";
    case Op::adamw_step:
      return "adamw_step";
    case Op::conv2d:
      return "conv2d";
    case Op::maxpool2d:
      return "maxpool2d";
    case Op::avgpool_global:
      return "avgpool_global";
    case Op::batchnorm:
      return "batchnorm";
    case Op::gelu:
      return "gelu";
    case Op::dropout:
      return "dropout";
    case Op::add:
      return "add";
  }
  return "?";
}

}  // namespace ringtrain::kernels
