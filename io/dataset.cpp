// Datasets over shard files: resolution of --data, global reads grouped by shard, the
// sample cache, and the writer used by `convert` (see dataset.hpp).
#include "io/dataset.hpp"

#include <glob.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>

namespace fs = std::filesystem;

namespace ringtrain::io {

std::vector<std::string> resolve_dataset_files(const std::string& spec) {
  std::error_code ec;
  std::vector<std::string> files;
  if (fs::is_directory(spec, ec)) {
    for (const auto& e : fs::directory_iterator(spec, ec))
      if (e.is_regular_file() && e.path().extension() == ".h5") files.push_back(e.path().string());
    RT_REQUIRE(!files.empty(), "dataset directory '", spec, "' holds no .h5 files");
  } else if (spec.find_first_of("*?[") != std::string::npos && !fs::exists(spec, ec)) {
    glob_t g{};
    const int rc = glob(spec.c_str(), 0, nullptr, &g);
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) files.push_back(g.gl_pathv[i]);
    globfree(&g);
    RT_REQUIRE(!files.empty(), "dataset pattern '", spec, "' matches no file");
  } else {
    files.push_back(spec);  // ShardFile names it if it does not exist
  }
  std::sort(files.begin(), files.end());
  return files;
}

Dataset::Dataset(const std::string& spec, bool labels_required) {
  info_.path = spec;
  for (const auto& f : resolve_dataset_files(spec)) {
    shards_.push_back(std::make_unique<ShardFile>(f));
    const ShardInfo& s = shards_.back()->info();
    const ShardInfo& first = shards_.front()->info();
    RT_REQUIRE(s.sample_shape == first.sample_shape && s.image_dtype == first.image_dtype &&
                   s.num_classes == first.num_classes && s.has_labels == first.has_labels &&
                   s.has_norm == first.has_norm && s.mean == first.mean && s.std == first.std,
               "dataset shard '", f, "' has samples ", shape_str(s.sample_shape), " ",
               dtype_name(s.image_dtype), " in ", s.num_classes, " classes, but '",
               shards_.front()->path(), "' has ", shape_str(first.sample_shape), " ",
               dtype_name(first.image_dtype), " in ", first.num_classes,
               " classes; all shards of a dataset must share one schema (labels or none, "
               "mean/std)");
    RT_REQUIRE(s.has_labels || !labels_required, "dataset '", f,
               "' has no /labels; training and eval need labelled data (`ringtrain predict` "
               "reads unlabelled data)");
    offsets_.push_back(info_.num_samples);
    info_.num_samples += s.num_samples;
  }
  offsets_.push_back(info_.num_samples);
  const ShardInfo& first = shards_.front()->info();
  info_.num_shards = int64_t(shards_.size());
  info_.sample_shape = first.sample_shape;
  info_.image_dtype = first.image_dtype;
  info_.num_classes = first.num_classes;
  info_.has_labels = first.has_labels;
  info_.has_norm = first.has_norm;
  info_.mean = first.mean;
  info_.std = first.std;
  sample_bytes_ = shards_.front()->sample_bytes();
}

Dataset::~Dataset() = default;

void Dataset::enable_cache() {
  if (cache_) return;
  // new[] without () leaves the pages untouched: memory is used as samples arrive.
  cache_.reset(new uint8_t[size_t(info_.num_samples * sample_bytes_)]);
  cache_labels_.assign(size_t(info_.num_samples), 0);
  cached_.assign(size_t(info_.num_samples), false);
}

void Dataset::read(const int64_t* idx, int64_t n, float* x, int32_t* y, double mean, double std) {
  if (n == 0) return;
  RT_CHECK(y == nullptr || info_.has_labels, "labels asked of '", info_.path, "', which has none");
  for (int64_t i = 0; i < n; ++i)
    RT_CHECK(idx[i] >= 0 && idx[i] < info_.num_samples, "sample index ", idx[i], " outside [0, ",
             info_.num_samples, ") in ", info_.path);
  // The distinct indices not in the cache, sorted: runs of rows per shard.
  std::vector<int64_t> need;
  need.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i)
    if (!cache_ || !cached_[size_t(idx[i])]) need.push_back(idx[i]);
  std::sort(need.begin(), need.end());
  need.erase(std::unique(need.begin(), need.end()), need.end());
  const int64_t m = int64_t(need.size());
  raw_.resize(size_t(m * sample_bytes_));
  labels_.resize(size_t(m));
  std::vector<int64_t> rows;
  for (int64_t lo = 0; lo < m;) {
    const size_t s =
        size_t(std::upper_bound(offsets_.begin(), offsets_.end(), need[lo]) - offsets_.begin() - 1);
    int64_t hi = lo;
    rows.clear();
    while (hi < m && need[hi] < offsets_[s + 1]) rows.push_back(need[hi++] - offsets_[s]);
    shards_[s]->read_rows(rows.data(), hi - lo, raw_.data() + lo * sample_bytes_,
                          labels_.data() + lo);
    lo = hi;
  }
  if (cache_) {
    for (int64_t j = 0; j < m; ++j) {
      const size_t g = size_t(need[j]);
      std::memcpy(cache_.get() + g * size_t(sample_bytes_), raw_.data() + j * sample_bytes_,
                  size_t(sample_bytes_));
      cache_labels_[g] = labels_[size_t(j)];
      cached_[g] = true;
    }
    cached_count_ += m;
  }

  const int64_t per = sample_numel();
  const float scale = float(1.0 / std), shift = float(-mean / std);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src;
    int64_t label;
    if (cache_) {
      src = cache_.get() + idx[i] * sample_bytes_;
      label = cache_labels_[size_t(idx[i])];
    } else {
      const int64_t j = std::lower_bound(need.begin(), need.end(), idx[i]) - need.begin();
      src = raw_.data() + j * sample_bytes_;
      label = labels_[size_t(j)];
    }
    float* dst = x + i * per;
    if (info_.image_dtype == DType::u8) {
      const float s = scale / 255.f;
      for (int64_t k = 0; k < per; ++k) dst[k] = float(src[k]) * s + shift;
    } else {
      const float* f = reinterpret_cast<const float*>(src);
      for (int64_t k = 0; k < per; ++k) dst[k] = f[k] * scale + shift;
    }
    if (!y) continue;
    RT_REQUIRE(label >= 0 && label < info_.num_classes, "dataset '", info_.path, "': label ", label,
               " of sample ", idx[i], " is outside [0, num_classes=", info_.num_classes, ")");
    y[i] = int32_t(label);
  }
}

namespace {

void write_one(const std::string& path, const uint8_t* images, const Shape& shape,
               const int32_t* labels, int64_t num_classes, double mean, double std) {
  H5Lock lock;
  const int64_t n = shape.at(0), per = shape_numel(shape) / n;
  H5Id file = create_file(path);
  write_attr(file, "format", std::string(kDatasetFormat));
  write_attr(file, "format_version", kDatasetVersion);
  write_attr(file, "num_classes", num_classes);
  write_attr(file, "mean", mean);
  write_attr(file, "std", std);
  // No filters on the data: uncompressed chunks let HDF5 read a selection straight from the
  // file without staging whole chunks.
  std::vector<hsize_t> dims(shape.begin(), shape.end()), chunk = dims;
  chunk[0] = std::min<hsize_t>(dims[0], std::max<hsize_t>(1, (1u << 20) / hsize_t(per)));
  H5Id space(H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr)));
  H5Id dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  H5_CHECK(H5Pset_chunk(dcpl, int(chunk.size()), chunk.data()));
  H5Id ds(H5_CHECK(
      H5Dcreate2(file, "images", H5T_NATIVE_UINT8, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
  H5_CHECK(H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, images));
  write_dataset(file, "labels", Tensor(const_cast<int32_t*>(labels), {n}, DType::i32), 1 << 18);
}

}  // namespace

std::vector<std::string> write_dataset_files(const std::string& path, const uint8_t* images,
                                             const Shape& shape, const int32_t* labels,
                                             int64_t num_classes, int shards) {
  const int64_t n = shape.at(0), per = shape_numel(shape) / n;
  RT_REQUIRE(shards >= 1 && shards <= n, "--shards ", shards, " is not valid for ", n,
             " samples; expected 1 to ", n);
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n * per; ++i) {
    const double v = images[i] / 255.0;
    sum += v;
    sq += v * v;
  }
  const double mean = sum / double(n * per);
  const double std = std::sqrt(std::max(0.0, sq / double(n * per) - mean * mean));
  if (shards == 1) {
    write_one(path, images, shape, labels, num_classes, mean, std);
    return {path};
  }
  std::string stem = path;
  if (stem.size() > 3 && stem.compare(stem.size() - 3, 3, ".h5") == 0) stem.resize(stem.size() - 3);
  std::vector<std::string> out;
  for (int s = 0; s < shards; ++s) {
    const int64_t lo = n * s / shards, hi = n * (s + 1) / shards;
    char suffix[40];
    std::snprintf(suffix, sizeof suffix, "-%05d-of-%05d.h5", s, shards);
    Shape part = shape;
    part[0] = hi - lo;
    out.push_back(stem + suffix);
    write_one(out.back(), images + lo * per, part, labels + lo, num_classes, mean, std);
  }
  return out;
}

}  // namespace ringtrain::io
