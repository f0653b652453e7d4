// NumPy arrays in, for `ringtrain convert npy` and `predict --out P.npy`: a reader of the .npy
// format (versions 1.0, 2.0, 3.0; the header is a Python dict literal, parsed here, never
// evaluated) and of .npz archives (zip files of .npy members, read with libzip), and a
// writer of float32 .npy files. Only plain numeric arrays in C order are accepted: object
// arrays (which NumPy stores pickled) and structured dtypes are refused, never unpickled.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace ringtrain::io {

// The element types this reader knows, by their NumPy names.
enum class NpyType { u1, i1, u2, i2, u4, i4, u8, i8, f4, f8 };
const char* npy_type_name(NpyType t);  // "uint8", "float32", ...
size_t npy_type_size(NpyType t);

struct NpyHeader {
  NpyType type = NpyType::u1;
  bool big_endian = false;  // '>' in the descr; the data is swapped to native when read
  Shape shape;
  size_t data_offset = 0;  // bytes from the start of the member to the first element
};

// Parses the magic, version and header dict at the start of `bytes` (at least the header;
// n is what is there). `what` names the file (and member) in messages. Input errors: not
// .npy, a truncated header, fortran_order True, an object ('O') or structured dtype, a type
// outside NpyType.
NpyHeader parse_npy_header(const uint8_t* bytes, size_t n, const std::string& what);

struct NpyArray {
  std::string what;  // "X.npy" or "X.npz:key", for messages
  NpyHeader header;
  std::vector<uint8_t> data;  // the elements, native byte order, C order
  int64_t count() const { return shape_numel(header.shape); }
};

// Reads `spec`: "X.npy", "X.npz:key" or "X.npz" (an archive of exactly one array). Input
// errors name the file, the member and what was expected; an .npz member is found as
// "key" or "key.npy".
NpyArray read_npy(const std::string& spec);

// Writes a float32 array of `shape` as a version 1.0 .npy file.
void write_npy_f32(const std::string& path, const float* data, const Shape& shape);

}  // namespace ringtrain::io
