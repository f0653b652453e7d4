// The ringtrain dataset format, version 1 (docs/formats.md): one HDF5 file with /images
// [N, C, H, W] or [N, D] (uint8 or float32, chunked along N) and /labels [N] (int32/int64).
// Dataset opens and validates a file and reads any set of samples by hyperslab, so a rank
// reads only the samples it trains on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "io/hdf5.hpp"

namespace ringtrain::io {

inline constexpr const char* kDatasetFormat = "ringtrain-dataset";
inline constexpr int64_t kDatasetVersion = 1;

struct DatasetInfo {
  std::string path;
  int64_t num_samples = 0;
  Shape sample_shape;  // [C, H, W] or [D]
  DType image_dtype = DType::u8;
  DType label_dtype = DType::i32;
  int64_t num_classes = 0;
  bool has_norm = false;     // mean/std attributes present
  double mean = 0, std = 1;  // of the pixel values after uint8 scaling to [0, 1]
};

class Dataset {
 public:
  // Opens and validates; any problem is an input error naming the file and what was expected.
  explicit Dataset(const std::string& path);
  const DatasetInfo& info() const { return info_; }
  int64_t sample_numel() const { return shape_numel(info_.sample_shape); }

  // Reads the samples at global indices idx[0..n) (any order, repeats allowed) into
  // x [n, sample] as float32, (v/255 for uint8 images) then (v - mean) / std, and y [n] as
  // int32. Indices are sorted and coalesced into runs of one hyperslab selection, so a batch
  // costs one read call per dataset.
  void read(const int64_t* idx, int64_t n, float* x, int32_t* y, double mean, double std);

 private:
  DatasetInfo info_;
  H5Id file_, images_, labels_;
  std::vector<uint8_t> raw_;  // the raw image bytes of the last read, sorted order
  std::vector<int64_t> raw_labels_;
};

// Writes a dataset file (format v1) from uint8 images [N, ...] and labels; computes and
// stores the mean/std attributes. Rows are chunked ~1 MiB per chunk along N.
void write_dataset_file(const std::string& path, const uint8_t* images, const Shape& shape,
                        const int32_t* labels, int64_t num_classes);

}  // namespace ringtrain::io
