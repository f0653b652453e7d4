// ShardFile: one validated file of the dataset format v1, and reads of sorted rows from it,
// coalesced into runs of consecutive rows. Images stored without filters (what `convert`
// writes) are read run by run with pread() at the file offsets HDF5 reports for their
// chunks: HDF5's own path for an irregular selection of chunked data walks it element by
// element (1.6 ms for 64 Fashion-MNIST samples, measured with perf). Filtered or unusual
// layouts, and RINGTRAIN_DIRECT_READ=0, use one hyperslab selection (runs OR-ed) instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "io/hdf5.hpp"

namespace ringtrain::io {

inline constexpr const char* kDatasetFormat = "ringtrain-dataset";
inline constexpr int64_t kDatasetVersion = 1;

struct ShardInfo {
  int64_t num_samples = 0;
  Shape sample_shape;  // [C, H, W] or [D]
  DType image_dtype = DType::u8;
  int64_t num_classes = 0;  // 0: unknown (allowed only without labels)
  bool has_labels = true;   // /labels present (unlabelled data is for `predict`)
  bool has_norm = false;
  double mean = 0, std = 1;
  // Per-channel /mean and /std datasets of shape [C] (empty when the file has none).
  std::vector<double> channel_mean, channel_std;
  // /targets [N, ...]: float32 (regression, multi-label 0/1) or integer (labels per
  // position, read as int32); absent: target_shape empty.
  bool has_targets = false;
  Shape target_shape;
  DType target_dtype = DType::f32;  // f32 or i32
};

class ShardFile {
 public:
  // Opens and validates; a problem is an input error naming the file and what was expected.
  explicit ShardFile(std::string path);
  ~ShardFile();
  ShardFile(ShardFile&&) = default;
  const std::string& path() const { return path_; }
  const ShardInfo& info() const { return info_; }
  int64_t sample_bytes() const;

  // Reads the rows rows[0..m) (sorted, distinct, local to this file) into raw (m sample
  // images, bytes as stored) and labels (m values; ignored for a file without labels).
  void read_rows(const int64_t* rows, int64_t m, uint8_t* raw, int64_t* labels);
  // Reads the rows' /targets (m samples, float32 or int32 as target_dtype) into `out`.
  void read_target_rows(const int64_t* rows, int64_t m, void* out);

 private:
  void plan_direct_reads(const Shape& ishape);
  void read_images_hyperslab(const int64_t* rows, int64_t m, uint8_t* raw);
  void read_images_direct(const int64_t* rows, int64_t m, uint8_t* raw);

  std::string path_;
  ShardInfo info_;
  H5Id file_, images_, labels_, targets_;
  // Direct reads: file offset of each chunk of rows (chunk_rows_ rows each), and the fd.
  int fd_ = -1;
  int64_t chunk_rows_ = 0;
  std::vector<uint64_t> chunk_addr_;
};

}  // namespace ringtrain::io
