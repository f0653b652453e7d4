// Parallel dataset and prediction writing (see convert_output.hpp). Images are written
// chunked in whole samples (about 1 MiB) without filters, as `convert idx` writes them, so
// the loader's direct pread path applies; labels carry Fletcher32 checksums.
#include "io/convert_output.hpp"

#include <sys/statvfs.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace fs = std::filesystem;

namespace ringtrain::io {

ParallelH5Writer::ParallelH5Writer(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  dxpl_ = H5Id(H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
  H5_CHECK(H5Pset_dxpl_mpio(dxpl_, H5FD_MPIO_COLLECTIVE));
}

H5Id ParallelH5Writer::create(const std::string& path) const {
  H5Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  H5_CHECK(H5Pset_fapl_mpio(fapl, comm_, MPI_INFO_NULL));
  H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, true));
  H5_CHECK(H5Pset_coll_metadata_write(fapl, true));
  struct statvfs st {};  // large objects start on a file-system block: no shared blocks
  const std::string dir = fs::path(path).parent_path().string();
  const hsize_t block = statvfs(dir.empty() ? "." : dir.c_str(), &st) == 0 && st.f_bsize > 0
                            ? hsize_t(st.f_bsize)
                            : 4096;
  H5_CHECK(H5Pset_alignment(fapl, 64 * 1024, block));
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (f < 0)
    throw_runtime(__FILE__, __LINE__, cat("cannot create '", path, "': ", h5_error_stack()));
  return H5Id(f);
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
                                                const uint8_t* images, const int64_t* labels) {
  const int64_t n = h.num_samples;
  RT_REQUIRE(shards >= 1 && shards <= n, "--shards ", shards, " is not valid for ", n,
             " samples; expected 1 to ", n);
  const std::vector<std::string> names = shard_names(out, shards);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const int64_t bytes = shape_numel(h.sample_shape) * int64_t(dtype_size(h.dtype));
  std::vector<int32_t> labels32;
  if (h.has_labels) labels32.assign(labels, labels + count);
  try {
    H5Lock lock;
    CollectiveFileScope collective;  // no one-rank closes of MPI-IO handles while unwinding
    ParallelH5Writer w(comm);
    for (int s = 0; s < shards; ++s) {
      const int64_t s_lo = n * s / shards, s_hi = n * (s + 1) / shards;
      // This rank's rows of the shard: [lo, lo + count) ∩ [s_lo, s_hi), in shard rows.
      const int64_t a = std::max(lo, s_lo), b = std::min(lo + count, s_hi);
      const int64_t mine = std::max<int64_t>(0, b - a);
      H5Id f = w.create(names[size_t(s)] + ".tmp");
      write_header(f, h);
      Shape shape = {s_hi - s_lo};
      shape.insert(shape.end(), h.sample_shape.begin(), h.sample_shape.end());
      const uint8_t* src = mine ? images + (a - lo) * bytes : images;
      w.write_rows(f, "images", h.dtype, shape, a - s_lo, mine, src, /*checksum=*/false);
      if (h.has_labels)
        w.write_rows(f, "labels", DType::i32, {s_hi - s_lo}, a - s_lo, mine,
                     mine ? labels32.data() + (a - lo) : labels32.data(), true, 1 << 18);
      const int64_t c = int64_t(h.mean.size());
      w.write_rows(f, "mean", DType::f64, {c}, 0, rank == 0 ? c : 0, h.mean.data(), false);
      w.write_rows(f, "std", DType::f64, {c}, 0, rank == 0 ? c : 0, h.std.data(), false);
      if (!h.class_names.empty()) w.write_strings(f, "class_names", h.class_names);
    }
    MPI_Barrier(comm);  // every file closed on every rank before any is renamed
    if (rank == 0) {
      for (const auto& name : names) {
        std::error_code ec;
        fs::rename(name + ".tmp", name, ec);
        RT_CHECK(!ec, "rename '", name, ".tmp' -> '", name, "': ", ec.message());
      }
    }
  } catch (...) {
    for (const auto& name : names) {
      std::error_code ec;
      fs::remove(name + ".tmp", ec);
    }
    throw;
  }
  return names;
}

}  // namespace ringtrain::io
