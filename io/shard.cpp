// One dataset file: validation and hyperslab reads (see shard.hpp).
#include "io/shard.hpp"
#include "core/env.hpp"
#include "io/stats_check.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace ringtrain::io {

namespace {

// Declared sizes are checked against what the file stores before anything is allocated
// from them: a dataset whose extent says 10^12 samples while its storage holds a few bytes
// is a damaged or hostile file, not a request for terabytes of memory.
void require_stored(hid_t ds, const std::string& file, const char* name, const Shape& shape,
                    size_t elem_bytes) {
  const std::string what = cat("dataset '", file, "': /", name);
  uint64_t bytes = elem_bytes;
  for (int64_t d : shape) {
    RT_REQUIRE(d >= 1, what, " has shape ", shape_str(shape), "; every dimension must be >= 1");
    RT_REQUIRE(!__builtin_mul_overflow(bytes, uint64_t(d), &bytes) && bytes < (uint64_t(1) << 62),
               what, " declares shape ", shape_str(shape),
               ", whose size in bytes overflows 64 bits; the file is damaged");
  }
  H5Id dcpl(H5_CHECK(H5Dget_create_plist(ds)));
  if (H5Pget_nfilters(dcpl) == 0) {
    // Unfiltered: the storage holds every byte (chunks at the edges may hold more).
    const uint64_t stored = H5Dget_storage_size(ds);
    RT_REQUIRE(stored >= bytes, what, " declares ", shape[0], " samples of shape ",
               shape_str(Shape(shape.begin() + 1, shape.end())), " (", bytes,
               " bytes) but the file stores ", stored,
               " bytes of it; the file is truncated or was never fully written");
    if (H5Pget_layout(dcpl) == H5D_CONTIGUOUS) {
      const haddr_t at = H5Dget_offset(ds);
      std::error_code ec;
      const uint64_t size = std::filesystem::file_size(file, ec);
      RT_REQUIRE(ec || (at != HADDR_UNDEF && at + bytes <= size), what, " (", bytes,
                 " bytes) reaches beyond the end of the file (", size,
                 " bytes); the file is truncated");
    }
    return;
  }
  // Filtered (compressed) chunks can be any size: every chunk must exist instead.
  std::vector<hsize_t> chunk(shape.size());
  RT_REQUIRE(H5Pget_chunk(dcpl, int(chunk.size()), chunk.data()) == int(chunk.size()), what,
             " is filtered but not chunked; the file is damaged");
  uint64_t expected = 1;
  for (size_t d = 0; d < shape.size(); ++d)
    expected *= (uint64_t(shape[d]) + chunk[d] - 1) / chunk[d];  // <= bytes: no overflow
  H5Id space(H5_CHECK(H5Dget_space(ds)));
  hsize_t have = 0;
  H5_CHECK(H5Dget_num_chunks(ds, space, &have));
  RT_REQUIRE(have == expected, what, " declares ", shape[0], " samples of shape ",
             shape_str(Shape(shape.begin() + 1, shape.end())), " in ", expected,
             " chunks but the file stores ", have,
             " of them; the file is truncated or was never fully written");
}

}  // namespace

ShardFile::ShardFile(std::string path) : path_(std::move(path)) {
  H5Lock lock;
  file_ = open_file_readonly(path_, "dataset");
  const std::string what = cat("dataset '", path_, "'");
  auto format = read_attr_string(file_, "format");
  RT_REQUIRE(!(format && *format == "ringtrain-tokens"), what,
             " holds a token stream (format 'ringtrain-tokens'), not images and labels; a model "
             "that takes images cannot train on it (a language model, e.g. gpt-tiny, can)");
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
  images_ = open_dataset(file_, "images", dapl);
  Shape ishape = dataset_shape(images_);
  auto itype = dataset_dtype(images_);
  RT_REQUIRE(itype && (*itype == DType::u8 || *itype == DType::f32), what,
             ": /images must be uint8 or float32");
  RT_REQUIRE(ishape.size() == 2 || ishape.size() == 4, what, ": /images has shape ",
             shape_str(ishape), "; expected [N, C, H, W] or [N, D]");
  RT_REQUIRE(ishape[0] > 0, what, " holds no samples");
  Shape lshape;
  std::optional<DType> ltype;
  if (info_.has_labels) {
    labels_ = open_dataset(file_, "labels");
    lshape = dataset_shape(labels_);
    ltype = dataset_dtype(labels_);
    RT_REQUIRE(ltype && (*ltype == DType::i32 || *ltype == DType::i64), what,
               ": /labels must be int32 or int64");
    RT_REQUIRE(lshape.size() == 1 && lshape[0] == ishape[0], what, ": /labels has shape ",
               shape_str(lshape), "; expected [", ishape[0], "] to match /images");
  }
  if (has_link(file_, "targets")) {
    targets_ = open_dataset(file_, "targets");
    const Shape tshape = dataset_shape(targets_);
    const auto ttype = dataset_dtype(targets_);
    RT_REQUIRE(ttype && (*ttype == DType::f32 || *ttype == DType::i32 || *ttype == DType::i64),
               what, ": /targets must be float32, int32 or int64");
    RT_REQUIRE(tshape.size() >= 2 && tshape[0] == ishape[0], what, ": /targets has shape ",
               shape_str(tshape), "; expected [", ishape[0],
               ", ...] (one target per sample of /images)");
    require_stored(targets_, path_, "targets", tshape, dtype_size(*ttype));
    info_.has_targets = true;
    info_.target_shape.assign(tshape.begin() + 1, tshape.end());
    info_.target_dtype = *ttype == DType::f32 ? DType::f32 : DType::i32;
  }
  require_stored(images_, path_, "images", ishape, dtype_size(*itype));
  if (info_.has_labels) require_stored(labels_, path_, "labels", lshape, dtype_size(*ltype));
  // Every sample is converted to fp32 in memory; one that cannot fit can never be trained on.
  const uint64_t sample_fp32 = uint64_t(shape_numel(Shape(ishape.begin() + 1, ishape.end()))) * 4;
  const uint64_t memory = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGE_SIZE));
  RT_REQUIRE(sample_fp32 <= memory, what, ": one sample of shape ",
             shape_str(Shape(ishape.begin() + 1, ishape.end())), " takes ", sample_fp32,
             " bytes as fp32, more than this machine's ", memory, " bytes of memory");
  info_.image_dtype = *itype;
  info_.num_samples = ishape[0];
  info_.sample_shape.assign(ishape.begin() + 1, ishape.end());
  // A std of exactly 0 (constant data, which `convert` records so) means "no
  // normalisation"; any other pair must be statistics the samples can have.
  auto mean = read_attr_double(file_, "mean"), std = read_attr_double(file_, "std");
  if (mean && std && *std != 0) {
    const std::string bad =
        normalisation_problem("attribute mean", *mean, "attribute std", *std, info_.image_dtype);
    RT_REQUIRE(bad.empty(), what, ": ", bad);
    info_.has_norm = true;
    info_.mean = *mean;
    info_.std = *std;
  }
  auto cmean = read_doubles(file_, "mean"), cstd = read_doubles(file_, "std");
  if (cmean || cstd) {
    const size_t c = info_.sample_shape.size() == 3 ? size_t(info_.sample_shape[0]) : 1;
    RT_REQUIRE(cmean && cstd && cmean->size() == c && cstd->size() == c, what,
               ": /mean and /std must both be datasets of shape [", c,
               "] (one value per channel of ", shape_str(info_.sample_shape), ")");
    for (size_t i = 0; i < c; ++i) {
      const std::string bad = normalisation_problem(
          cat("/mean[", i, "]"), (*cmean)[i], cat("/std[", i, "]"), (*cstd)[i], info_.image_dtype);
      RT_REQUIRE(bad.empty(), what, ": ", bad);
    }
    info_.channel_mean = *cmean;
    info_.channel_std = *cstd;
  }
  plan_direct_reads(ishape);
}

void ShardFile::plan_direct_reads(const Shape& ishape) {
  if (!env::direct_read()) return;
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
  targets_.reset();
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

void ShardFile::read_target_rows(const int64_t* rows, int64_t m, void* out) {
  if (m == 0) return;
  H5Lock lock;
  const hsize_t elems = hsize_t(m * shape_numel(info_.target_shape));
  H5Id fspace(H5_CHECK(H5Dget_space(targets_)));
  select_rows(fspace, rows, m);
  H5Id mspace(H5_CHECK(H5Screate_simple(1, &elems, nullptr)));
  RT_REQUIRE(
      H5Dread(targets_, info_.target_dtype == DType::f32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT32,
              mspace, fspace, H5P_DEFAULT, out) >= 0,
      "dataset '", path_, "': /targets could not be read (", h5_error_stack(),
      "); the file may be truncated or corrupt");
}

}  // namespace ringtrain::io
