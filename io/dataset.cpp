// Dataset file validation, batched hyperslab reads, and the writer used by `convert`.
#include "io/dataset.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ringtrain::io {

Dataset::Dataset(const std::string& path) {
  info_.path = path;
  file_ = open_file_readonly(path, "dataset");
  const std::string what = cat("dataset '", path, "'");
  auto format = read_attr_string(file_, "format");
  RT_REQUIRE(format && *format == kDatasetFormat, what,
             " is not a ringtrain dataset: root attribute "
             "'format' is ",
             format ? "'" + *format + "'" : std::string("missing"), "; expected '", kDatasetFormat,
             "' (create one with `ringtrain convert idx`)");
  auto version = read_attr_int(file_, "format_version");
  RT_REQUIRE(version && *version == kDatasetVersion, what, " has format_version ",
             version ? std::to_string(*version) : "missing", "; this ringtrain reads version ",
             kDatasetVersion);
  auto classes = read_attr_int(file_, "num_classes");
  RT_REQUIRE(classes && *classes >= 2, what, " needs an integer attribute num_classes >= 2");
  info_.num_classes = *classes;

  RT_REQUIRE(has_link(file_, "images") && has_link(file_, "labels"), what,
             " must hold datasets /images and /labels");
  // No chunk cache for the images: with uncompressed chunks HDF5 then reads just the
  // selected rows instead of staging a whole ~1 MiB chunk for every sample.
  H5Id dapl(H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS)));
  H5_CHECK(H5Pset_chunk_cache(dapl, 0, 0, 1.0));
  images_ = H5Id(H5_CHECK(H5Dopen2(file_, "images", dapl)));
  labels_ = open_dataset(file_, "labels");
  Shape ishape = dataset_shape(images_), lshape = dataset_shape(labels_);
  auto itype = dataset_dtype(images_), ltype = dataset_dtype(labels_);
  RT_REQUIRE(itype && (*itype == DType::u8 || *itype == DType::f32), what,
             ": /images must be uint8 or float32");
  RT_REQUIRE(ltype && (*ltype == DType::i32 || *ltype == DType::i64), what,
             ": /labels must be int32 or int64");
  RT_REQUIRE(ishape.size() == 2 || ishape.size() == 4, what, ": /images has shape ",
             shape_str(ishape), "; expected [N, C, H, W] or [N, D]");
  RT_REQUIRE(lshape.size() == 1 && lshape[0] == ishape[0], what, ": /labels has shape ",
             shape_str(lshape), "; expected [", ishape[0], "] to match /images");
  RT_REQUIRE(ishape[0] > 0, what, " holds no samples");
  info_.image_dtype = *itype;
  info_.label_dtype = *ltype;
  info_.num_samples = ishape[0];
  info_.sample_shape.assign(ishape.begin() + 1, ishape.end());
  auto mean = read_attr_double(file_, "mean"), std = read_attr_double(file_, "std");
  if (mean && std && *std > 0) {
    info_.has_norm = true;
    info_.mean = *mean;
    info_.std = *std;
  }
}

void Dataset::read(const int64_t* idx, int64_t n, float* x, int32_t* y, double mean, double std) {
  if (n == 0) return;
  // Sort the requested positions, keep each one's destination, and select the distinct
  // indices as runs of consecutive rows.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return idx[a] < idx[b]; });
  std::vector<int64_t> uniq;
  std::vector<int64_t> slot(static_cast<size_t>(n));  // order position -> row in the read buffer
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = idx[order[i]];
    RT_CHECK(g >= 0 && g < info_.num_samples, "sample index ", g, " outside [0, ",
             info_.num_samples, ") in ", info_.path);
    if (uniq.empty() || uniq.back() != g) uniq.push_back(g);
    slot[order[i]] = int64_t(uniq.size()) - 1;
  }
  const int64_t m = int64_t(uniq.size());
  const int64_t per = sample_numel();
  const size_t esize = dtype_size(info_.image_dtype);

  auto select_runs = [&](hid_t space) {
    const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space));
    std::vector<hsize_t> start(static_cast<size_t>(rank), 0);
    std::vector<hsize_t> count(static_cast<size_t>(rank));
    H5_CHECK(H5Sget_simple_extent_dims(space, count.data(), nullptr));
    H5_CHECK(H5Sselect_none(space));
    for (int64_t i = 0; i < m;) {
      int64_t j = i + 1;
      while (j < m && uniq[j] == uniq[j - 1] + 1) ++j;
      start[0] = hsize_t(uniq[i]);
      count[0] = hsize_t(j - i);
      H5_CHECK(
          H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr));
      i = j;
    }
  };

  raw_.resize(size_t(m * per) * esize);
  raw_labels_.resize(size_t(m));
  {
    H5Id fspace(H5_CHECK(H5Dget_space(images_)));
    select_runs(fspace);
    hsize_t mdims = hsize_t(m * per);
    H5Id mspace(H5_CHECK(H5Screate_simple(1, &mdims, nullptr)));
    H5_CHECK(
        H5Dread(images_, h5_type(info_.image_dtype), mspace, fspace, H5P_DEFAULT, raw_.data()));
  }
  {
    H5Id fspace(H5_CHECK(H5Dget_space(labels_)));
    select_runs(fspace);
    hsize_t mdims = hsize_t(m);
    H5Id mspace(H5_CHECK(H5Screate_simple(1, &mdims, nullptr)));
    H5_CHECK(H5Dread(labels_, H5T_NATIVE_INT64, mspace, fspace, H5P_DEFAULT, raw_labels_.data()));
  }

  const float scale = float(1.0 / std), shift = float(-mean / std);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = slot[i];
    float* dst = x + i * per;
    if (info_.image_dtype == DType::u8) {
      const uint8_t* src = raw_.data() + row * per;
      const float s = scale / 255.f;
      for (int64_t k = 0; k < per; ++k) dst[k] = float(src[k]) * s + shift;
    } else {
      const float* src = reinterpret_cast<const float*>(raw_.data()) + row * per;
      for (int64_t k = 0; k < per; ++k) dst[k] = src[k] * scale + shift;
    }
    const int64_t label = raw_labels_[size_t(row)];
    RT_REQUIRE(label >= 0 && label < info_.num_classes, "dataset '", info_.path, "': label ", label,
               " of sample ", idx[i], " is outside [0, num_classes=", info_.num_classes, ")");
    y[i] = int32_t(label);
  }
}

void write_dataset_file(const std::string& path, const uint8_t* images, const Shape& shape,
                        const int32_t* labels, int64_t num_classes) {
  const int64_t n = shape.at(0), per = shape_numel(shape) / n;
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n * per; ++i) {
    const double v = images[i] / 255.0;
    sum += v;
    sq += v * v;
  }
  const double mean = sum / double(n * per);
  const double std = std::sqrt(std::max(0.0, sq / double(n * per) - mean * mean));

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

}  // namespace ringtrain::io
