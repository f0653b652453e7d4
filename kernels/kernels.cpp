// Backend-neutral helpers of the kernels layer.
#include "kernels/kernels.hpp"

namespace ringtrain::kernels {

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
