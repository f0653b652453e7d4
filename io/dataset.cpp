// Datasets over shard files: resolution of --data, global reads grouped by shard, the
// sample cache, and the writer used by `convert` (see dataset.hpp).
#include "io/dataset.hpp"

#include <glob.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <regex>
#include <set>

#include "io/output_file.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {

namespace {

// Files named NAME-<k>-of-<N>.h5 form one series: all N must be present, so that a lost
// shard is an error instead of a run that silently trains on the rest.
void require_complete_series(const std::vector<std::string>& files, const std::string& spec) {
  static const std::regex shard_re(R"((.*)-(\d+)-of-(\d+)\.h5)");
  std::map<std::pair<std::string, std::string>, std::set<int64_t>> series;  // (NAME, N) -> ks
  std::map<std::pair<std::string, std::string>, size_t> width;  // digits of k, as written
  for (const auto& f : files) {
    std::smatch m;
    if (!std::regex_match(f, m, shard_re) || m[2].length() > 9 || m[3].length() > 9) continue;
    series[{m[1], m[3]}].insert(std::stoll(m[2]));
    width[{m[1], m[3]}] = size_t(m[2].length());
  }
  for (const auto& [key, present] : series) {
    const int64_t total = std::stoll(key.second);
    std::vector<std::string> missing;
    int64_t count = 0;
    for (int64_t k = 0; k < total; ++k) {
      if (present.count(k)) continue;
      if (++count <= 5) {
        std::string digits = std::to_string(k);
        digits.insert(0, width[key] > digits.size() ? width[key] - digits.size() : 0, '0');
        missing.push_back(cat("'", key.first, "-", digits, "-of-", key.second, ".h5'"));
      }
    }
    if (count == 0) continue;
    std::string names;
    for (const auto& n : missing) {
      if (!names.empty()) names += ", ";
      names += n;
    }
    throw_input(cat("dataset '", spec, "' is a series of ", total, " shards but ", count,
                    " of them ", count == 1 ? "is" : "are", " missing: ", names,
                    count > 5 ? " ..." : "",
                    "; restore them (or name the shards to use with a ? or [...] pattern)"));
  }
}

// The sorted, distinct global indices `need` in runs that fall in one shard:
// f(shard, rows within that shard, [lo, hi) of `need`).
template <typename F>
void for_each_shard_run(const std::vector<int64_t>& offsets, const std::vector<int64_t>& need,
                        F&& f) {
  const int64_t m = int64_t(need.size());
  std::vector<int64_t> rows;
  for (int64_t lo = 0; lo < m;) {
    const size_t s = size_t(std::upper_bound(offsets.begin(), offsets.end(), need[size_t(lo)]) -
                            offsets.begin() - 1);
    int64_t hi = lo;
    rows.clear();
    while (hi < m && need[size_t(hi)] < offsets[s + 1])
      rows.push_back(need[size_t(hi++)] - offsets[s]);
    f(s, rows, lo, hi);
    lo = hi;
  }
}

}  // namespace

std::vector<std::string> resolve_dataset_files(const std::string& spec) {
  std::error_code ec;
  std::vector<std::string> files;
  // A directory or a '*' glob means "the dataset there": its shard series must be complete.
  // A pattern of only ? and [...] picks shards on purpose (e.g. holding one out).
  const bool whole = fs::is_directory(spec, ec) || spec.find('*') != std::string::npos;
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
  if (whole) require_complete_series(files, spec);
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
                   s.has_norm == first.has_norm && s.mean == first.mean && s.std == first.std &&
                   s.channel_mean == first.channel_mean && s.channel_std == first.channel_std &&
                   s.has_targets == first.has_targets && s.target_shape == first.target_shape &&
                   s.target_dtype == first.target_dtype,
               "dataset shard '", f, "' has samples ", shape_str(s.sample_shape), " ",
               dtype_name(s.image_dtype), " in ", s.num_classes, " classes, but '",
               shards_.front()->path(), "' has ", shape_str(first.sample_shape), " ",
               dtype_name(first.image_dtype), " in ", first.num_classes,
               " classes; all shards of a dataset must share one schema (labels or none, "
               "targets or none, mean/std)");
    RT_REQUIRE(s.has_labels || s.has_targets || !labels_required, "dataset '", f,
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
  info_.channel_mean = first.channel_mean;
  info_.channel_std = first.channel_std;
  info_.has_targets = first.has_targets;
  info_.target_shape = first.target_shape;
  info_.target_dtype = first.target_dtype;
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

Normalization normalization_of(const DatasetInfo& info) {
  Normalization n;
  if (!info.channel_mean.empty()) {
    n.mean = info.channel_mean;
    n.std = info.channel_std;
  } else if (info.has_norm) {
    n.mean = {info.mean};
    n.std = {info.std};
  }
  return n;
}

void Dataset::read(const int64_t* idx, int64_t n, float* x, int32_t* y, const Normalization& norm) {
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
  for_each_shard_run(offsets_, need,
                     [&](size_t s, const std::vector<int64_t>& rows, int64_t lo, int64_t hi) {
                       shards_[s]->read_rows(rows.data(), hi - lo, raw_.data() + lo * sample_bytes_,
                                             labels_.data() + lo);
                     });
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
  // One (scale, shift) per channel; a scalar normalisation is one channel of all elements.
  const size_t channels = norm.mean.size();
  RT_CHECK(channels == norm.std.size() && channels >= 1 && per % int64_t(channels) == 0,
           "normalisation of ", channels, " channels for samples of ", per, " elements");
  const int64_t plane = per / int64_t(channels);
  std::vector<float> scale(channels), shift(channels);
  for (size_t c = 0; c < channels; ++c) {
    scale[c] = float(1.0 / norm.std[c]);
    shift[c] = float(-norm.mean[c] / norm.std[c]);
  }
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
    for (size_t c = 0; c < channels; ++c) {
      float* dst = x + i * per + int64_t(c) * plane;
      const int64_t at = int64_t(c) * plane;
      if (info_.image_dtype == DType::u8) {
        const float s = scale[c] / 255.f;
        for (int64_t k = 0; k < plane; ++k) dst[k] = float(src[at + k]) * s + shift[c];
      } else {
        const float* f = reinterpret_cast<const float*>(src) + at;
        // NaN and inf have every exponent bit set: an integer OR over the plane (which
        // vectorises, unlike a float reduction) finds them in the same pass.
        uint32_t non_finite = 0;
        for (int64_t k = 0; k < plane; ++k) {
          dst[k] = f[k] * scale[c] + shift[c];
          uint32_t bits;
          std::memcpy(&bits, f + k, 4);
          non_finite |= uint32_t((bits & 0x7f800000u) == 0x7f800000u);
        }
        if (non_finite) reject_non_finite(idx[i], reinterpret_cast<const float*>(src));
      }
    }
    if (!y) continue;
    RT_REQUIRE(label >= 0 && label < info_.num_classes, "dataset '", info_.path, "': label ", label,
               " of sample ", idx[i], " is outside [0, num_classes=", info_.num_classes, ")");
    y[i] = int32_t(label);
  }
}

void Dataset::read_targets(const int64_t* idx, int64_t n, void* t) {
  if (n == 0) return;
  RT_CHECK(info_.has_targets, "targets asked of '", info_.path, "', which has none");
  const int64_t per = shape_numel(info_.target_shape);
  const size_t bytes = size_t(per) * 4;  // float32 or int32
  if (cache_ && !target_cache_) {
    target_cache_.reset(new uint8_t[size_t(info_.num_samples) * bytes]);
    target_cached_.assign(size_t(info_.num_samples), false);
  }
  std::vector<int64_t> need;
  for (int64_t i = 0; i < n; ++i) {
    RT_CHECK(idx[i] >= 0 && idx[i] < info_.num_samples, "sample index ", idx[i], " outside [0, ",
             info_.num_samples, ") in ", info_.path);
    if (!target_cache_ || !target_cached_[size_t(idx[i])]) need.push_back(idx[i]);
  }
  std::sort(need.begin(), need.end());
  need.erase(std::unique(need.begin(), need.end()), need.end());
  const int64_t m = int64_t(need.size());
  target_raw_.resize(size_t(m) * bytes);
  for_each_shard_run(
      offsets_, need, [&](size_t s, const std::vector<int64_t>& rows, int64_t lo, int64_t hi) {
        shards_[s]->read_target_rows(rows.data(), hi - lo, target_raw_.data() + size_t(lo) * bytes);
        if (info_.target_dtype == DType::f32)
          for (int64_t j = lo; j < hi; ++j) {
            const float* f = reinterpret_cast<const float*>(target_raw_.data() + size_t(j) * bytes);
            for (int64_t k = 0; k < per; ++k)
              if (!std::isfinite(f[k]))
                throw_input(cat("dataset '", shards_[s]->path(), "': sample ", need[j], " (row ",
                                need[j] - offsets_[s], " of this file) holds target ", f[k],
                                " at element ", k, "; float targets must be finite"));
          }
      });
  if (target_cache_)
    for (int64_t j = 0; j < m; ++j) {
      std::memcpy(target_cache_.get() + size_t(need[j]) * bytes,
                  target_raw_.data() + size_t(j) * bytes, bytes);
      target_cached_[size_t(need[j])] = true;
    }
  auto* out = static_cast<uint8_t*>(t);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src;
    if (target_cache_) {
      src = target_cache_.get() + size_t(idx[i]) * bytes;
    } else {
      const int64_t j = std::lower_bound(need.begin(), need.end(), idx[i]) - need.begin();
      src = target_raw_.data() + size_t(j) * bytes;
    }
    std::memcpy(out + size_t(i) * bytes, src, bytes);
  }
}

void Dataset::reject_non_finite(int64_t index, const float* sample) const {
  const int64_t per = sample_numel();
  int64_t k = 0;
  while (k < per && std::isfinite(sample[k])) ++k;
  const size_t s =
      size_t(std::upper_bound(offsets_.begin(), offsets_.end(), index) - offsets_.begin() - 1);
  throw_input(cat("dataset '", shards_[s]->path(), "': sample ", index, " (row ",
                  index - offsets_[s], " of this file) holds ", k < per ? sample[k] : NAN,
                  " at element ", k, "; float images must be finite"));
}

namespace {

struct Stats {
  double mean = 0, std = 1;                       // over every element
  std::vector<double> channel_mean, channel_std;  // per channel
};

void write_one(const std::string& path, const uint8_t* images, const Shape& shape,
               const int32_t* labels, int64_t num_classes, const Stats& st) {
  H5Lock lock;
  const int64_t n = shape.at(0), per = shape_numel(shape) / n;
  H5Id file = create_file(path);
  write_attr(file, "format", std::string(kDatasetFormat));
  write_attr(file, "format_version", kDatasetVersion);
  write_attr(file, "num_classes", num_classes);
  write_attr(file, "mean", st.mean);
  write_attr(file, "std", st.std);
  // float64, so that one channel's values equal the attributes exactly. A constant channel
  // (std 0) cannot be normalised: then there are none, as the attributes are then ignored.
  const bool usable =
      std::all_of(st.channel_std.begin(), st.channel_std.end(), [](double v) { return v > 0; });
  const hsize_t channels = st.channel_mean.size();
  for (const auto& [name, v] :
       {std::pair<const char*, const std::vector<double>*>{"mean", &st.channel_mean},
        {"std", &st.channel_std}}) {
    if (!usable) break;
    H5Id cspace(H5_CHECK(H5Screate_simple(1, &channels, nullptr)));
    H5Id cds(H5_CHECK(
        H5Dcreate2(file, name, H5T_NATIVE_DOUBLE, cspace, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    H5_CHECK(H5Dwrite(cds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v->data()));
    cds.close(cat("dataset '", name, "' of '", path, "'"));
  }
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
  // Closing writes the chunks HDF5 still caches: a full disk often shows only here.
  ds.close(cat("dataset 'images' of '", path, "'"));
  write_dataset(file, "labels", Tensor(const_cast<int32_t*>(labels), {n}, DType::i32), 1 << 18);
  file.close(cat("'", path, "'"));
}

}  // namespace

std::vector<std::string> write_dataset_files(const std::string& path, const uint8_t* images,
                                             const Shape& shape, const int32_t* labels,
                                             int64_t num_classes, int shards) {
  const int64_t n = shape.at(0), per = shape_numel(shape) / n;
  RT_REQUIRE(shards >= 1 && shards <= n, "--shards ", shards, " is not valid for ", n,
             " samples; expected 1 to ", n);
  Stats st;
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n * per; ++i) {
    const double v = images[i] / 255.0;
    sum += v;
    sq += v * v;
  }
  st.mean = sum / double(n * per);
  st.std = std::sqrt(std::max(0.0, sq / double(n * per) - st.mean * st.mean));
  // Per channel, the C of [N, C, H, W] (other shapes are one channel), summed in the same
  // element order, so that one channel's values are the attributes' exactly.
  const int64_t channels = shape.size() == 4 ? shape[1] : 1, plane = per / channels;
  std::vector<double> csum(size_t(channels), 0.0), csq(size_t(channels), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < channels; ++c) {
      const uint8_t* p = images + i * per + c * plane;
      for (int64_t k = 0; k < plane; ++k) {
        const double v = p[k] / 255.0;
        csum[size_t(c)] += v;
        csq[size_t(c)] += v * v;
      }
    }
  for (int64_t c = 0; c < channels; ++c) {
    const double cnt = double(n * plane), m = csum[size_t(c)] / cnt;
    st.channel_mean.push_back(m);
    st.channel_std.push_back(std::sqrt(std::max(0.0, csq[size_t(c)] / cnt - m * m)));
  }
  std::vector<std::string> out;
  if (shards == 1) {
    out.push_back(path);
  } else {
    std::string stem = path;
    if (stem.size() > 3 && stem.compare(stem.size() - 3, 3, ".h5") == 0)
      stem.resize(stem.size() - 3);
    for (int s = 0; s < shards; ++s) {
      char suffix[40];
      std::snprintf(suffix, sizeof suffix, "-%05d-of-%05d.h5", s, shards);
      out.push_back(stem + suffix);
    }
  }
  // Each file is written under a .tmp name and the names are given only when all are
  // complete: a failed conversion leaves no file that looks like a dataset.
  write_outputs(out, [&](std::string* current) {
    for (int s = 0; s < shards; ++s) {
      const int64_t lo = n * s / shards, hi = n * (s + 1) / shards;
      Shape part = shape;
      part[0] = hi - lo;
      *current = out[size_t(s)];
      write_one(out[size_t(s)] + ".tmp", images + lo * per, part, labels + lo, num_classes, st);
    }
  });
  return out;
}

}  // namespace ringtrain::io
