// One dataset file: validation and hyperslab reads (see shard.hpp).
#include "io/shard.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace ringtrain::io {

ShardFile::ShardFile(std::string path) : path_(std::move(path)) {
  H5Lock lock;
  file_ = open_file_readonly(path_, "dataset");
  const std::string what = cat("dataset '", path_, "'");
  auto format = read_attr_string(file_, "format");
  RT_REQUIRE(format && *format == kDatasetFormat, what,
             " is not a ringtrain dataset: root attribute 'format' is ",
             format ? "'" + *format + "'" : std::string("missing"), "; expected '", kDatasetFormat,
             "' (create one with `ringtrain convert idx`)");
  auto version = read_attr_int(file_, "format_version");
  RT_REQUIRE(version && *version == kDatasetVersion, what, " has format_version ",
             version ? std::to_string(*version) : "missing", "; this ringtrain reads version ",
             kDatasetVersion);
  RT_REQUIRE(has_link(file_, "images"), what, " must hold a dataset /images");
  info_.has_labels = has_link(file_, "labels");
  // Unlabelled data (for `predict`) may leave the number of classes unsaid.
  auto classes = read_attr_int(file_, "num_classes");
  RT_REQUIRE((classes && *classes >= 2) || (!classes && !info_.has_labels), what,
             " needs an integer attribute num_classes >= 2",
             info_.has_labels ? "" : " (or none, as it has no /labels)");
  info_.num_classes = classes ? *classes : 0;
  // No chunk cache for the images: with uncompressed chunks HDF5 then reads just the
  // selected rows instead of staging a whole ~1 MiB chunk for every sample.
  H5Id dapl(H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS)));
  H5_CHECK(H5Pset_chunk_cache(dapl, 0, 0, 1.0));
  images_ = H5Id(H5_CHECK(H5Dopen2(file_, "images", dapl)));
  Shape ishape = dataset_shape(images_);
  auto itype = dataset_dtype(images_);
  RT_REQUIRE(itype && (*itype == DType::u8 || *itype == DType::f32), what,
             ": /images must be uint8 or float32");
  RT_REQUIRE(ishape.size() == 2 || ishape.size() == 4, what, ": /images has shape ",
             shape_str(ishape), "; expected [N, C, H, W] or [N, D]");
  if (info_.has_labels) {
    labels_ = open_dataset(file_, "labels");
    Shape lshape = dataset_shape(labels_);
    auto ltype = dataset_dtype(labels_);
    RT_REQUIRE(ltype && (*ltype == DType::i32 || *ltype == DType::i64), what,
               ": /labels must be int32 or int64");
    RT_REQUIRE(lshape.size() == 1 && lshape[0] == ishape[0], what, ": /labels has shape ",
               shape_str(lshape), "; expected [", ishape[0], "] to match /images");
  }
  RT_REQUIRE(ishape[0] > 0, what, " holds no samples");
  info_.image_dtype = *itype;
  info_.num_samples = ishape[0];
  info_.sample_shape.assign(ishape.begin() + 1, ishape.end());
  auto mean = read_attr_double(file_, "mean"), std = read_attr_double(file_, "std");
  if (mean && std && *std > 0) {
    info_.has_norm = true;
    info_.mean = *mean;
    info_.std = *std;
  }
  plan_direct_reads(ishape);
}

void ShardFile::plan_direct_reads(const Shape& ishape) {
  const char* env = std::getenv("RINGTRAIN_DIRECT_READ");
  if (env && std::string(env) == "0") return;
  H5Id dcpl(H5_CHECK(H5Dget_create_plist(images_)));
  H5Id type(H5_CHECK(H5Dget_type(images_)));
  if (H5Pget_nfilters(dcpl) != 0 || H5Tequal(type, h5_type(info_.image_dtype)) <= 0) return;
  const int64_t n = ishape[0];
  std::vector<uint64_t> addr;
  int64_t rows = 0;
  const H5D_layout_t layout = H5Pget_layout(dcpl);
  if (layout == H5D_CONTIGUOUS) {
    const haddr_t a = H5Dget_offset(images_);
    if (a == HADDR_UNDEF) return;
    rows = n;
    addr.push_back(a);
  } else if (layout == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(ishape.size());
    if (H5Pget_chunk(dcpl, int(chunk.size()), chunk.data()) != int(chunk.size())) return;
    for (size_t d = 1; d < chunk.size(); ++d)
      if (int64_t(chunk[d]) != ishape[d]) return;  // a chunk must hold whole samples
    rows = int64_t(chunk[0]);
    const int64_t nchunks = (n + rows - 1) / rows;
    addr.assign(size_t(nchunks), HADDR_UNDEF);
    hsize_t have = 0;
    H5Id space(H5_CHECK(H5Dget_space(images_)));  // 1.10 rejects H5S_ALL here
    if (H5Dget_num_chunks(images_, space, &have) < 0 || int64_t(have) != nchunks) return;
    std::vector<hsize_t> off(ishape.size());
    for (hsize_t i = 0; i < have; ++i) {
      unsigned mask = 0;
      haddr_t a = HADDR_UNDEF;
      hsize_t size = 0;
      if (H5Dget_chunk_info(images_, space, i, off.data(), &mask, &a, &size) < 0) return;
      addr[size_t(int64_t(off[0]) / rows)] = a;
    }
    for (uint64_t a : addr)
      if (a == HADDR_UNDEF) return;
  } else {
    return;
  }
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) return;
  chunk_rows_ = rows;
  chunk_addr_ = std::move(addr);
}

ShardFile::~ShardFile() {
  if (fd_ >= 0) ::close(fd_);
  H5Lock lock;
  images_.reset();
  labels_.reset();
  file_.reset();
}

int64_t ShardFile::sample_bytes() const {
  return shape_numel(info_.sample_shape) * int64_t(dtype_size(info_.image_dtype));
}

namespace {

// Selects rows[0..m) (sorted, distinct) of a dataset's first dimension as runs of
// consecutive rows OR-ed together.
void select_rows(hid_t space, const int64_t* rows, int64_t m) {
  const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> start(static_cast<size_t>(rank), 0);
  std::vector<hsize_t> count(static_cast<size_t>(rank));
  H5_CHECK(H5Sget_simple_extent_dims(space, count.data(), nullptr));
  H5_CHECK(H5Sselect_none(space));
  for (int64_t i = 0; i < m;) {
    int64_t j = i + 1;
    while (j < m && rows[j] == rows[j - 1] + 1) ++j;
    start[0] = hsize_t(rows[i]);
    count[0] = hsize_t(j - i);
    H5_CHECK(
        H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr));
    i = j;
  }
}

}  // namespace

void ShardFile::read_images_hyperslab(const int64_t* rows, int64_t m, uint8_t* raw) {
  const hsize_t elems = hsize_t(m * shape_numel(info_.sample_shape));
  H5Id fspace(H5_CHECK(H5Dget_space(images_)));
  select_rows(fspace, rows, m);
  H5Id mspace(H5_CHECK(H5Screate_simple(1, &elems, nullptr)));
  RT_REQUIRE(H5Dread(images_, h5_type(info_.image_dtype), mspace, fspace, H5P_DEFAULT, raw) >= 0,
             "dataset '", path_, "': /images could not be read (", h5_error_stack(),
             "); the file may be truncated or corrupt");
}

void ShardFile::read_images_direct(const int64_t* rows, int64_t m, uint8_t* raw) {
  const int64_t bytes = sample_bytes();
  for (int64_t i = 0; i < m;) {
    // A run of consecutive rows within one chunk: one pread.
    const int64_t chunk = rows[i] / chunk_rows_, end = (chunk + 1) * chunk_rows_;
    int64_t j = i + 1;
    while (j < m && rows[j] == rows[j - 1] + 1 && rows[j] < end) ++j;
    const size_t len = size_t((j - i) * bytes);
    off_t at =
        off_t(chunk_addr_[size_t(chunk)] + uint64_t((rows[i] - chunk * chunk_rows_) * bytes));
    size_t done = 0;
    while (done < len) {
      const ssize_t got = ::pread(fd_, raw + i * bytes + done, len - done, at + off_t(done));
      RT_REQUIRE(got > 0, "dataset '", path_, "': reading samples ", rows[i], "..", rows[j - 1],
                 " failed (", got < 0 ? std::strerror(errno) : "end of file",
                 "); the file may be truncated");
      done += size_t(got);
    }
    i = j;
  }
}

void ShardFile::read_rows(const int64_t* rows, int64_t m, uint8_t* raw, int64_t* labels) {
  if (m == 0) return;
  if (fd_ >= 0) {
    read_images_direct(rows, m, raw);
  }
  H5Lock lock;
  if (fd_ < 0) read_images_hyperslab(rows, m, raw);
  if (!info_.has_labels) return;
  H5Id lspace(H5_CHECK(H5Dget_space(labels_)));
  select_rows(lspace, rows, m);
  const hsize_t lm = hsize_t(m);
  H5Id lmspace(H5_CHECK(H5Screate_simple(1, &lm, nullptr)));
  RT_REQUIRE(H5Dread(labels_, H5T_NATIVE_INT64, lmspace, lspace, H5P_DEFAULT, labels) >= 0,
             "dataset '", path_, "': /labels could not be read (", h5_error_stack(),
             "); the file may be truncated or corrupt");
}

}  // namespace ringtrain::io
