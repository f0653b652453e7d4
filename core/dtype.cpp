// DType names, sizes and parsing (the scalar conversions are inline in dtype.hpp).
#include "core/dtype.hpp"

#include "core/error.hpp"

namespace ringtrain {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f16:
      return 2;
    case DType::bf16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
    case DType::f64:
      return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "fp32";
    case DType::f16:
      return "fp16";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::u8:
      return "uint8";
    case DType::f64:
      return "fp64";
  }
  return "?";
}

bool is_float(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

DType parse_float_dtype(std::string_view s, std::string_view what) {
  if (s == "fp32" || s == "f32" || s == "float32") return DType::f32;
  if (s == "fp16" || s == "f16" || s == "float16" || s == "half") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  throw_input(cat(what, " '", s, "' is not a floating-point type; expected fp32, fp16 or bf16"));
}

}  // namespace ringtrain
