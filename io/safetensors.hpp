// Safetensors files (Hugging Face's weight format): an 8-byte little-endian header length, a
// JSON header {"NAME": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}
// and the tensors' bytes, row-major, little-endian. Read through a read-only memory map, so a
// tensor is never copied whole: readers convert the elements they need straight from the
// mapped file. Written from fp32 tensors, one after another, in the order given. Used by
// `convert hf`, `train --init-from HF_DIR` and `export --format hf`.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace ringtrain::io {

struct SafetensorsEntry {
  std::string dtype;  // F32, F16, BF16, F64 (the float dtypes a reader converts)
  Shape shape;
  const unsigned char* data = nullptr;  // into the map
  int64_t numel() const { return shape_numel(shape); }
};

// One mapped .safetensors file. Input errors name the file and what is wrong: a header
// length beyond the file (a truncated header), a header that is not JSON or not of this
// layout, a dtype this reader does not convert, offsets outside the data or not matching
// the shape.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  SafetensorsFile(SafetensorsFile&& o) noexcept;

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& tensors() const { return tensors_; }
  const SafetensorsEntry* find(const std::string& name) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, SafetensorsEntry> tensors_;
};

// Elements [first, first + count) of a mapped tensor (row-major) as fp32, into out.
void safetensors_read_f32(const SafetensorsEntry& e, int64_t first, int64_t count, float* out);

// What export writes per tensor: its name, shape and a function that writes its elements
// (fp32, row-major) into the space given.
struct SafetensorsOut {
  std::string name;
  Shape shape;
  std::function<void(float*)> fill;
};
// Writes PATH (PATH.tmp first, renamed when complete) with the tensors in order, F32, and
// __metadata__ {"format": "pt"} (what transformers' from_pretrained requires). The header is
// padded with spaces to a multiple of 8 bytes, as the safetensors library does.
void write_safetensors(const std::string& path, const std::vector<SafetensorsOut>& tensors);

}  // namespace ringtrain::io
