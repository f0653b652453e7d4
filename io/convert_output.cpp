// Parallel dataset and prediction writing (see convert_output.hpp). Images are written
// chunked in whole samples (about 1 MiB) without filters, as `convert idx` writes them, so
// the loader's direct pread path applies; labels carry Fletcher32 checksums.
#include "io/convert_output.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "io/mpi_check.hpp"
#include "io/output_file.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {

ParallelH5Writer::ParallelH5Writer(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  dxpl_ = H5Id(H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
  H5_CHECK(H5Pset_dxpl_mpio(dxpl_, H5FD_MPIO_COLLECTIVE));
}

H5Id ParallelH5Writer::create(const std::string& path, uint64_t reserve_bytes) const {
  int reserved = 0;
  if (rank_ == 0) reserved = reserve_output(path, reserve_bytes);
  IO_MPI_CHECK(MPI_Bcast(&reserved, 1, MPI_INT, 0, comm_));
  if (reserved != 0) {  // the same on every rank
    if (rank_ == 0) remove_quietly(path);
    if (no_space_errno(reserved)) throw_disk_full("writing", path, "nothing was written");
    throw_runtime(__FILE__, __LINE__, cat("cannot create '", path, "': ", std::strerror(reserved)));
  }
  H5Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  H5_CHECK(H5Pset_fapl_mpio(fapl, comm_, MPI_INFO_NULL));
  H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, true));
  H5_CHECK(H5Pset_coll_metadata_write(fapl, true));
  // Large objects start on a file-system block: no shared blocks.
  H5_CHECK(H5Pset_alignment(fapl, 64 * 1024, fs_block_size(path)));
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (f < 0)
    throw_runtime(__FILE__, __LINE__, cat("cannot create '", path, "': ", h5_error_stack()));
  return H5Id(f);
}

ChunkedExtent ParallelH5Writer::extent(const Shape& shape, DType dtype, int64_t chunk_rows) {
  const uint64_t rows = uint64_t(std::max<int64_t>(shape.empty() ? 1 : shape[0], 1));
  const uint64_t bytes = uint64_t(shape_numel(shape)) * dtype_size(dtype);
  const uint64_t row_bytes = std::max<uint64_t>(bytes / rows, 1);
  const uint64_t chunk =
      chunk_rows > 0 ? uint64_t(chunk_rows) : std::max<uint64_t>(1, (1u << 20) / row_bytes);
  return {bytes, std::min(chunk, rows) * row_bytes};
}

void ParallelH5Writer::close(H5Id& file, const std::string& path) {
  if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0)
    throw_runtime(__FILE__, __LINE__, cat("flushing '", path, "' failed: ", h5_error_stack()));
  file.close(cat("'", path, "'"));
}

void ParallelH5Writer::write_rows(hid_t loc, const std::string& name, DType dtype,
                                  const Shape& shape, int64_t lo, int64_t count, const void* data,
                                  bool checksum, int64_t chunk_rows) const {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  const hsize_t row_bytes =
      hsize_t(shape_numel(shape) / std::max<int64_t>(shape[0], 1)) * hsize_t(dtype_size(dtype));
  if (chunk_rows <= 0)
    chunk_rows = int64_t(std::max<hsize_t>(1, (1u << 20) / std::max<hsize_t>(row_bytes, 1)));
  std::vector<hsize_t> chunk = dims;
  chunk[0] = std::max<hsize_t>(1, std::min(hsize_t(chunk_rows), dims[0]));
  H5Id fspace(H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr)));
  H5Id dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  H5_CHECK(H5Pset_chunk(dcpl, int(chunk.size()), chunk.data()));
  if (checksum) H5_CHECK(H5Pset_fletcher32(dcpl));
  H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  H5Id ds(H5_CHECK(
      H5Dcreate2(loc, name.c_str(), h5_type(dtype), fspace, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
  std::vector<hsize_t> mdims = dims;
  mdims[0] = hsize_t(std::max<int64_t>(count, 1));
  H5Id mspace(H5_CHECK(H5Screate_simple(int(mdims.size()), mdims.data(), nullptr)));
  if (count > 0) {
    std::vector<hsize_t> start(dims.size(), 0), cnt = dims;
    start[0] = hsize_t(lo);
    cnt[0] = hsize_t(count);
    H5_CHECK(
        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, cnt.data(), nullptr));
  } else {  // nothing of it is ours, but the transfer is collective
    H5_CHECK(H5Sselect_none(fspace));
    H5_CHECK(H5Sselect_none(mspace));
  }
  H5_CHECK(H5Dwrite(ds, h5_type(dtype), mspace, fspace, dxpl_, data));
  ds.close(cat("dataset '", name, "'"));
}

void ParallelH5Writer::write_strings(hid_t loc, const std::string& name,
                                     const std::vector<std::string>& v) const {
  size_t width = 1;
  for (const auto& s : v) width = std::max(width, s.size());
  std::vector<char> buf(v.size() * width, '\0');
  for (size_t i = 0; i < v.size(); ++i)
    std::memcpy(buf.data() + i * width, v[i].data(), v[i].size());
  H5Id type(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(type, width));
  H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  H5_CHECK(H5Tset_strpad(type, H5T_STR_NULLPAD));
  const hsize_t n = v.size();
  H5Id fspace(H5_CHECK(H5Screate_simple(1, &n, nullptr)));
  H5Id ds(
      H5_CHECK(H5Dcreate2(loc, name.c_str(), type, fspace, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  H5Id mspace(H5_CHECK(H5Screate_simple(1, &n, nullptr)));
  if (rank_ != 0) {  // rank 0 writes the values, the others take part in the transfer
    H5_CHECK(H5Sselect_none(fspace));
    H5_CHECK(H5Sselect_none(mspace));
  }
  H5_CHECK(H5Dwrite(ds, type, mspace, fspace, dxpl_, buf.data()));
  ds.close(cat("dataset '", name, "'"));
}

std::vector<std::string> read_strings(hid_t loc, const std::string& name, const std::string& what) {
  H5Id ds = open_dataset(loc, name);
  const Shape shape = dataset_shape(ds);
  RT_REQUIRE(shape.size() == 1, what, ": /", name, " has shape ", shape_str(shape),
             "; expected a 1-d list of strings");
  H5Id type(H5_CHECK(H5Dget_type(ds)));
  RT_REQUIRE(H5Tget_class(type) == H5T_STRING, what, ": /", name, " does not hold strings");
  const size_t n = size_t(shape[0]);
  std::vector<std::string> out(n);
  H5Id mem(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_cset(mem, H5Tget_cset(type)));
  if (H5Tis_variable_str(type) > 0) {
    H5_CHECK(H5Tset_size(mem, H5T_VARIABLE));
    std::vector<char*> p(n, nullptr);
    RT_REQUIRE(H5Dread(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data()) >= 0, what, ": /", name,
               " cannot be read (", h5_error_stack(), ")");
    for (size_t i = 0; i < n; ++i) out[i] = p[i] ? p[i] : "";
    H5Id space(H5_CHECK(H5Dget_space(ds)));
    H5Dvlen_reclaim(mem, space, H5P_DEFAULT, p.data());
    return out;
  }
  const size_t width = H5Tget_size(type);
  H5_CHECK(H5Tset_size(mem, width));
  H5_CHECK(H5Tset_strpad(mem, H5T_STR_NULLPAD));  // all `width` bytes, no terminator kept
  std::vector<char> buf(n * width + 1, '\0');
  RT_REQUIRE(H5Dread(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0, what, ": /", name,
             " cannot be read (", h5_error_stack(), ")");
  for (size_t i = 0; i < n; ++i) {
    const char* s = buf.data() + i * width;
    out[i] = std::string(s, strnlen(s, width));
  }
  return out;
}

std::vector<std::string> read_class_names(const std::string& dataset_file) {
  H5Lock lock;
  H5Id f = open_file_readonly(dataset_file, "dataset");
  if (!has_link(f, "class_names")) return {};
  return read_strings(f, "class_names", cat("dataset '", dataset_file, "'"));
}

void add_channel_stats(const uint8_t* images, int64_t n, const Shape& sample, DType dtype,
                       double* sum, double* sq) {
  const int64_t c = sample.size() == 3 ? sample[0] : 1;
  const int64_t per = shape_numel(sample) / c;  // values per channel per sample
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t ch = 0; ch < c; ++ch) {
      double s = 0, q = 0;
      const int64_t off = (i * c + ch) * per;
      if (dtype == DType::u8) {
        uint64_t si = 0, qi = 0;  // exact in integers, then scaled
        for (int64_t k = 0; k < per; ++k) {
          const uint64_t v = images[off + k];
          si += v;
          qi += v * v;
        }
        s = double(si);
        q = double(qi);
      } else {
        const float* f = reinterpret_cast<const float*>(images) + off;
        for (int64_t k = 0; k < per; ++k) {
          s += f[k];
          q += double(f[k]) * f[k];
        }
      }
      sum[ch] += s;
      sq[ch] += q;
    }
  }
}

std::vector<std::string> shard_names(const std::string& out, int shards) {
  if (shards == 1) return {out};
  std::string stem = out;
  if (stem.size() > 3 && stem.compare(stem.size() - 3, 3, ".h5") == 0) stem.resize(stem.size() - 3);
  std::vector<std::string> names;
  for (int s = 0; s < shards; ++s) {
    char suffix[40];
    std::snprintf(suffix, sizeof suffix, "-%05d-of-%05d.h5", s, shards);
    names.push_back(stem + suffix);
  }
  return names;
}

namespace {

void write_header(hid_t f, const DatasetHeader& h) {
  write_attr(f, "format", std::string("ringtrain-dataset"));
  write_attr(f, "format_version", int64_t(1));
  if (h.num_classes > 0) write_attr(f, "num_classes", h.num_classes);
  write_attr(f, "mean", h.mean_all);
  write_attr(f, "std", h.std_all);
}

}  // namespace

std::vector<std::string> write_dataset_parallel(MPI_Comm comm, const std::string& out, int shards,
                                                const DatasetHeader& h, int64_t lo, int64_t count,
                                                const uint8_t* images, const int64_t* labels,
                                                const void* targets) {
  const int64_t n = h.num_samples;
  RT_REQUIRE(shards >= 1 && shards <= n, "--shards ", shards, " is not valid for ", n,
             " samples; expected 1 to ", n);
  const std::vector<std::string> names = shard_names(out, shards);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const int64_t bytes = shape_numel(h.sample_shape) * int64_t(dtype_size(h.dtype));
  std::vector<int32_t> labels32;
  if (h.has_labels) labels32.assign(labels, labels + count);
  std::string current = names.front();  // the file being written, for the message
  size_t committed = 0;
  try {
    H5Lock lock;
    CollectiveFileScope collective;  // no one-rank closes of MPI-IO handles while unwinding
    ParallelH5Writer w(comm);
    for (int s = 0; s < shards; ++s) {
      const int64_t s_lo = n * s / shards, s_hi = n * (s + 1) / shards;
      // This rank's rows of the shard: [lo, lo + count) ∩ [s_lo, s_hi), in shard rows.
      const int64_t a = std::max(lo, s_lo), b = std::min(lo + count, s_hi);
      const int64_t mine = std::max<int64_t>(0, b - a);
      Shape shape = {s_hi - s_lo};
      shape.insert(shape.end(), h.sample_shape.begin(), h.sample_shape.end());
      const int64_t c = int64_t(h.mean.size());
      uint64_t names_bytes = 0;
      for (const auto& cn : h.class_names) names_bytes += cn.size() + 8;
      std::vector<ChunkedExtent> extents = {ParallelH5Writer::extent(shape, h.dtype),
                                            ParallelH5Writer::extent({c}, DType::f64),
                                            ParallelH5Writer::extent({c}, DType::f64),
                                            {names_bytes, names_bytes}};
      if (h.has_labels)
        extents.push_back(ParallelH5Writer::extent({s_hi - s_lo}, DType::i32, 1 << 18));
      Shape tshape = {s_hi - s_lo};
      tshape.insert(tshape.end(), h.target_shape.begin(), h.target_shape.end());
      if (!h.target_shape.empty())
        extents.push_back(ParallelH5Writer::extent(tshape, h.target_dtype));
      current = names[size_t(s)];
      H5Id f = w.create(names[size_t(s)] + ".tmp",
                        h5_file_bytes_bound(extents, fs_block_size(names[size_t(s)]), 4096));
      write_header(f, h);
      const uint8_t* src = mine ? images + (a - lo) * bytes : images;
      w.write_rows(f, "images", h.dtype, shape, a - s_lo, mine, src, /*checksum=*/false);
      if (h.has_labels)
        w.write_rows(f, "labels", DType::i32, {s_hi - s_lo}, a - s_lo, mine,
                     mine ? labels32.data() + (a - lo) : labels32.data(), true, 1 << 18);
      if (!h.target_shape.empty()) {
        const int64_t tbytes = shape_numel(h.target_shape) * 4;
        const auto* t = static_cast<const uint8_t*>(targets);
        w.write_rows(f, "targets", h.target_dtype, tshape, a - s_lo, mine,
                     mine ? t + (a - lo) * tbytes : t, true);
      }
      w.write_rows(f, "mean", DType::f64, {c}, 0, rank == 0 ? c : 0, h.mean.data(), false);
      w.write_rows(f, "std", DType::f64, {c}, 0, rank == 0 ? c : 0, h.std.data(), false);
      if (!h.class_names.empty()) w.write_strings(f, "class_names", h.class_names);
      ParallelH5Writer::close(f, names[size_t(s)] + ".tmp");
    }
    MPI_Barrier(comm);  // every file closed on every rank before any is renamed
    if (rank == 0) {
      for (const auto& name : names) {
        current = name;
        commit_output(name + ".tmp", name);
        ++committed;
      }
    }
  } catch (...) {
    rethrow_write_failure(current, [&] {
      for (size_t i = 0; i < names.size(); ++i)
        remove_quietly(names[i] + (i < committed ? "" : ".tmp"));
    });
  }
  return names;
}

}  // namespace ringtrain::io
