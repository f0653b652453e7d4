// The training data as ringtrain sees it: one dataset (format v1, docs/formats.md) made
// of one or more shard files with the same schema, named by a file, a directory (its *.h5
// files) or a glob. The global sample index runs through the shards in name order. Reads
// of any set of global indices go to each shard as one sorted, coalesced hyperslab read,
// so a rank reads only the samples it trains on; --cache keeps what was read in memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "io/shard.hpp"

namespace ringtrain::io {

struct DatasetInfo {
  std::string path;  // as given: file, directory or glob
  int64_t num_samples = 0;
  int64_t num_shards = 0;
  Shape sample_shape;  // [C, H, W] or [D]
  DType image_dtype = DType::u8;
  int64_t num_classes = 0;   // 0: unknown (unlabelled data)
  bool has_labels = true;    // /labels present in every shard
  bool has_norm = false;     // mean/std attributes present
  double mean = 0, std = 1;  // of the pixel values after uint8 scaling to [0, 1]
  // Per channel (the /mean and /std datasets of shape [C]); empty when absent.
  std::vector<double> channel_mean, channel_std;
  // /targets: one sample's shape (empty when absent) and dtype (f32, or i32 for integer
  // targets such as labels per pixel).
  bool has_targets = false;
  Shape target_shape;
  DType target_dtype = DType::f32;
};

// The input normalisation x' = (x - mean[c]) / std[c]: one value for every element, or one
// per channel of [C, H, W] samples.
struct Normalization {
  std::vector<double> mean = {0}, std = {1};
  bool per_channel() const { return mean.size() > 1; }
};
// The dataset's own: per channel when it has /mean and /std, else its scalar attributes,
// else none (0 and 1).
Normalization normalization_of(const DatasetInfo& info);

// The shard files a --data value names, in name order (input error when none).
std::vector<std::string> resolve_dataset_files(const std::string& spec);

class Dataset {
 public:
  // Opens and validates every shard; they must agree on sample shape, dtype, classes and
  // targets. Without /labels (or /targets) a dataset is an input error unless
  // labels_required is false (predict; the trainer checks what its loss reads itself).
  explicit Dataset(const std::string& spec, bool labels_required = true);
  ~Dataset();
  const DatasetInfo& info() const { return info_; }
  int64_t sample_numel() const { return shape_numel(info_.sample_shape); }

  // Keeps every sample read from then on in memory (raw bytes; at most the whole dataset),
  // so that later epochs read each sample from the files at most once.
  void enable_cache();
  int64_t cached_samples() const { return cached_count_; }

  // Reads the samples at global indices idx[0..n) (any order, repeats allowed) into
  // x [n, sample] as float32 (v/255 for uint8 images, then (v - mean[c]) / std[c]) and y [n]
  // as int32 (y may be null, and must be for data without labels). A label outside
  // [0, num_classes) or a non-finite float pixel is an input error naming the file and the
  // global sample index. Not for concurrent calls on one Dataset.
  void read(const int64_t* idx, int64_t n, float* x, int32_t* y, const Normalization& norm);
  // Reads the /targets of the same kind of index list into t [n, target...] (float32 or
  // int32, as info().target_dtype). A non-finite float target is an input error naming the
  // file and the global sample index.
  void read_targets(const int64_t* idx, int64_t n, void* t);

 private:
  // Input error naming the shard file and global index of a float sample holding NaN/inf.
  [[noreturn]] void reject_non_finite(int64_t index, const float* sample) const;

  DatasetInfo info_;
  std::vector<std::unique_ptr<ShardFile>> shards_;
  std::vector<int64_t> offsets_;  // first global index of each shard, plus N at the end
  int64_t sample_bytes_ = 0;
  std::vector<uint8_t> raw_;  // raw images of the samples being read
  std::vector<int64_t> labels_;
  // The cache: raw bytes and label per global index, and whether each is present.
  std::unique_ptr<uint8_t[]> cache_;
  std::vector<int64_t> cache_labels_;
  std::vector<bool> cached_;
  int64_t cached_count_ = 0;
  // Targets: the rows being read, and their cache (per global index, as the images').
  std::vector<uint8_t> target_raw_;
  std::unique_ptr<uint8_t[]> target_cache_;
  std::vector<bool> target_cached_;
};

// Writes a dataset (format v1) from uint8 images [N, ...] and labels, as one file or as
// `shards` files NAME-00000-of-0000S.h5 (NAME = path without .h5) of contiguous samples.
// The mean/std attributes and the per-channel /mean and /std datasets ([C]; C = 1 for
// [N, H, W] or [N, D] images), computed over all samples, are the same in every shard.
// Returns the files written.
std::vector<std::string> write_dataset_files(const std::string& path, const uint8_t* images,
                                             const Shape& shape, const int32_t* labels,
                                             int64_t num_classes, int shards = 1);

}  // namespace ringtrain::io
