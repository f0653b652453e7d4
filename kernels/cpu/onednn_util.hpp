// Helpers shared by the oneDNN convolution and matmul providers: the oneDNN data type of a
// ringtrain DType, and whether an implementation name is one of oneDNN's reference kernels
// (correct but far slower than the widening path, so never counted as support).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "core/dtype.hpp"
#include "core/error.hpp"

namespace ringtrain::kernels::cpu {

// `what` names the caller in the error ("oneDNN matmul").
inline dnnl::memory::data_type dnnl_type(DType t, const char* what) {
  switch (t) {
    case DType::f32:
      return dnnl::memory::data_type::f32;
    case DType::bf16:
      return dnnl::memory::data_type::bf16;
    case DType::f16:
      return dnnl::memory::data_type::f16;
    default:
      break;
  }
  throw_runtime(__FILE__, __LINE__, cat(what, " of ", dtype_name(t), " is not supported"));
}

inline bool is_reference_impl(const std::string& impl) { return impl.rfind("ref", 0) == 0; }

}  // namespace ringtrain::kernels::cpu
