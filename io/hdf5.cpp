// HDF5 helpers (see hdf5.hpp).
#include "io/hdf5.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/files.hpp"

namespace ringtrain::io {

namespace {
struct Collected {
  std::string text;
  bool no_space = false;
};

herr_t collect(unsigned n, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<Collected*>(data);
  if (!e->desc || !*e->desc) return 0;
  if (n < 3) out->text += cat(n ? "; " : "", e->func_name, ": ", e->desc);
  // The sec2 driver's words for a full device, deep in the stack.
  const std::string desc = e->desc;
  if (desc.find("errno = 28,") != std::string::npos ||
      desc.find("No space left on device") != std::string::npos)
    out->no_space = true;
  return 0;
}
}  // namespace

std::string h5_error_stack() {
  Collected out;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &out);
  if (out.text.empty()) out.text = "no HDF5 error message";
  return out.no_space ? out.text + " (ENOSPC)" : out.text;
}

std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex m;
  return m;
}

void silence_hdf5_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

void H5Id::reset() { close_status(); }

void H5Id::close(const std::string& what) {
  if (close_status() < 0)
    throw_runtime(__FILE__, __LINE__, cat("closing ", what, " failed: ", h5_error_stack()));
}

herr_t H5Id::close_status() {
  if (id_ < 0) return 0;
  H5Lock lock;
  herr_t rc = 0;
  switch (H5Iget_type(id_)) {
    case H5I_FILE:
      rc = H5Fclose(id_);
      break;
    case H5I_GROUP:
      rc = H5Gclose(id_);
      break;
    case H5I_DATASET:
      rc = H5Dclose(id_);
      break;
    case H5I_DATASPACE:
      H5Sclose(id_);
      break;
    case H5I_DATATYPE:
      H5Tclose(id_);
      break;
    case H5I_ATTR:
      H5Aclose(id_);
      break;
    case H5I_GENPROP_LST:
      H5Pclose(id_);
      break;
    default:
      break;
  }
  id_ = H5I_INVALID_HID;
  return rc;
}

H5Id open_file_readonly(const std::string& path, const char* role) {
  // A FIFO or device would block H5Fis_hdf5 (and every later read) forever.
  require_regular_file(path, role, "an HDF5 file");
  RT_REQUIRE(H5Fis_hdf5(path.c_str()) > 0, role, " '", path,
             "' is not an HDF5 file (or is truncated)");
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  RT_REQUIRE(f >= 0, role, " '", path, "' could not be opened as HDF5: ", h5_error_stack());
  return H5Id(f);
}

H5Id create_file(const std::string& path) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0)
    throw_runtime(__FILE__, __LINE__, cat("cannot create '", path, "': ", h5_error_stack()));
  return H5Id(f);
}

bool has_attr(hid_t obj, const char* name) { return H5Aexists(obj, name) > 0; }

namespace {
void write_attr_raw(hid_t obj, const char* name, hid_t type, const void* value) {
  if (has_attr(obj, name)) H5_CHECK(H5Adelete(obj, name));
  H5Id space(H5_CHECK(H5Screate(H5S_SCALAR)));
  H5Id attr(H5_CHECK(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT)));
  H5_CHECK(H5Awrite(attr, type, value));
}
}  // namespace

void write_attr(hid_t obj, const char* name, const std::string& value) {
  H5Id type(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(type, value.empty() ? 1 : value.size()));
  H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  std::string v = value.empty() ? std::string(1, '\0') : value;
  write_attr_raw(obj, name, type, v.data());
}

void write_attr(hid_t obj, const char* name, int64_t value) {
  write_attr_raw(obj, name, H5T_NATIVE_INT64, &value);
}

void write_attr(hid_t obj, const char* name, double value) {
  write_attr_raw(obj, name, H5T_NATIVE_DOUBLE, &value);
}

namespace {

// The file an object lives in, for messages ("?" if HDF5 cannot say).
std::string file_of(hid_t obj) {
  const ssize_t n = H5Fget_name(obj, nullptr, 0);
  if (n <= 0) return "?";
  std::string name(size_t(n) + 1, '\0');
  H5Fget_name(obj, name.data(), name.size());
  name.resize(size_t(n));
  return name;
}

// An attribute that must be read: an input error naming the file, the attribute and what
// was expected, with HDF5's words only as the detail after it.
[[noreturn]] void bad_attr(hid_t obj, const char* name, const char* expected,
                           const std::string& detail) {
  throw_input(
      cat("'", file_of(obj), "': attribute '", name, "' ", detail, "; expected ", expected));
}

// Opens attribute `name` of obj if its type is of class `cls` (else an invalid id: the
// caller answers "not this kind") and checks that it holds exactly one value.
H5Id open_attr_of_class(hid_t obj, const char* name, H5T_class_t cls, const char* expected) {
  H5Id attr(H5Aopen(obj, name, H5P_DEFAULT));
  if (attr.get() < 0)
    bad_attr(obj, name, expected, cat("cannot be opened (", h5_error_stack(), ")"));
  H5Id type(H5Aget_type(attr));
  const H5T_class_t c = type.get() < 0 ? H5T_NO_CLASS : H5Tget_class(type);
  const bool number = cls == H5T_FLOAT && c == H5T_INTEGER;  // an integer is a number too
  if (c != cls && !number) return H5Id();
  H5Id space(H5Aget_space(attr));
  const hssize_t n = space.get() < 0 ? -1 : H5Sget_simple_extent_npoints(space);
  if (n != 1) bad_attr(obj, name, expected, cat("holds ", n, " values"));
  return attr;
}

}  // namespace

std::optional<std::string> read_attr_string(hid_t obj, const char* name) {
  if (!has_attr(obj, name)) return std::nullopt;
  const char* expected = "one string (fixed or variable length, ASCII or UTF-8)";
  H5Id attr = open_attr_of_class(obj, name, H5T_STRING, expected);
  if (attr.get() < 0) return std::nullopt;
  H5Id type(H5Aget_type(attr));
  // The memory type carries the file's character set: HDF5 has no conversion between
  // ASCII and UTF-8, and h5py writes str attributes as variable-length UTF-8.
  const H5T_cset_t cset = H5Tget_cset(type);
  if (H5Tis_variable_str(type) > 0) {
    char* s = nullptr;
    H5Id mem(H5Tcopy(H5T_C_S1));
    if (mem.get() < 0 || H5Tset_size(mem, H5T_VARIABLE) < 0 || H5Tset_cset(mem, cset) < 0 ||
        H5Aread(attr, mem, &s) < 0)
      bad_attr(obj, name, expected, cat("cannot be read as a string (", h5_error_stack(), ")"));
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  std::string out(H5Tget_size(type), '\0');
  if (H5Aread(attr, type, out.data()) < 0)
    bad_attr(obj, name, expected, cat("cannot be read as a string (", h5_error_stack(), ")"));
  out.resize(std::strlen(out.c_str()));
  return out;
}

std::optional<int64_t> read_attr_int(hid_t obj, const char* name) {
  if (!has_attr(obj, name)) return std::nullopt;
  H5Id attr = open_attr_of_class(obj, name, H5T_INTEGER, "one integer");
  if (attr.get() < 0) return std::nullopt;
  int64_t v = 0;
  if (H5Aread(attr, H5T_NATIVE_INT64, &v) < 0)
    bad_attr(obj, name, "one integer",
             cat("cannot be read as a 64-bit integer (", h5_error_stack(), ")"));
  return v;
}

std::optional<double> read_attr_double(hid_t obj, const char* name) {
  if (!has_attr(obj, name)) return std::nullopt;
  H5Id attr = open_attr_of_class(obj, name, H5T_FLOAT, "one number");
  if (attr.get() < 0) return std::nullopt;
  double v = 0;
  if (H5Aread(attr, H5T_NATIVE_DOUBLE, &v) < 0)
    bad_attr(obj, name, "one number", cat("cannot be read as a number (", h5_error_stack(), ")"));
  return v;
}

void write_attr(hid_t obj, const char* name, const std::vector<double>& values) {
  if (has_attr(obj, name)) H5_CHECK(H5Adelete(obj, name));
  const hsize_t n = values.size();
  H5Id space(H5_CHECK(H5Screate_simple(1, &n, nullptr)));
  H5Id attr(H5_CHECK(H5Acreate2(obj, name, H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, H5P_DEFAULT)));
  H5_CHECK(H5Awrite(attr, H5T_NATIVE_DOUBLE, values.data()));
}

std::optional<std::vector<double>> read_attr_doubles(hid_t obj, const char* name) {
  if (!has_attr(obj, name)) return std::nullopt;
  H5Id attr(H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT)));
  H5Id type(H5_CHECK(H5Aget_type(attr)));
  auto cls = H5Tget_class(type);
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) return std::nullopt;
  H5Id space(H5_CHECK(H5Aget_space(attr)));
  std::vector<double> v(
      size_t(std::max<hssize_t>(H5_CHECK(H5Sget_simple_extent_npoints(space)), 0)));
  H5_CHECK(H5Aread(attr, H5T_NATIVE_DOUBLE, v.data()));
  return v;
}

std::optional<std::vector<double>> read_doubles(hid_t loc, const char* name) {
  if (!has_link(loc, name)) return std::nullopt;
  H5Id ds = open_dataset(loc, name);
  H5Id type(H5_CHECK(H5Dget_type(ds)));
  auto cls = H5Tget_class(type);
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) return std::nullopt;
  H5Id space(H5_CHECK(H5Dget_space(ds)));
  if (H5Sget_simple_extent_ndims(space) != 1) return std::nullopt;
  std::vector<double> v(
      size_t(std::max<hssize_t>(H5_CHECK(H5Sget_simple_extent_npoints(space)), 0)));
  H5_CHECK(H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
  return v;
}

bool has_link(hid_t loc, const std::string& path) {
  // H5Lexists needs every intermediate component to exist: check them one by one.
  size_t pos = 0;
  while (true) {
    size_t next = path.find('/', pos);
    std::string part = path.substr(0, next);
    if (!part.empty() && H5Lexists(loc, part.c_str(), H5P_DEFAULT) <= 0) return false;
    if (next == std::string::npos) return true;
    pos = next + 1;
  }
}

H5Id create_group(hid_t loc, const std::string& name) {
  return H5Id(H5_CHECK(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
}

void require_dataset_object(hid_t loc, const std::string& name) {
  // HDF5's own refusal (H5Dopen2: "not a dataset") would be a runtime error without the
  // file's name; a group or named type where a dataset belongs is a bad input file.
  H5O_info_t info{};
  if (H5Oget_info_by_name2(loc, name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return;
  if (info.type == H5O_TYPE_DATASET) return;
  const char* kind = info.type == H5O_TYPE_GROUP            ? "a group"
                     : info.type == H5O_TYPE_NAMED_DATATYPE ? "a named datatype"
                                                            : "not a dataset";
  throw_input(cat("'", file_of(loc), "': /", name, " is ", kind, "; expected a dataset"));
}

H5Id open_dataset(hid_t loc, const std::string& name, hid_t dapl) {
  require_dataset_object(loc, name);
  return H5Id(H5_CHECK(H5Dopen2(loc, name.c_str(), dapl)));
}

Shape dataset_shape(hid_t ds) {
  H5Id space(H5_CHECK(H5Dget_space(ds)));
  int rank = H5_CHECK(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  return Shape(dims.begin(), dims.end());
}

hid_t h5_type(DType t) {
  switch (t) {
    case DType::f32:
      return H5T_NATIVE_FLOAT;
    case DType::i32:
      return H5T_NATIVE_INT32;
    case DType::i64:
      return H5T_NATIVE_INT64;
    case DType::u8:
      return H5T_NATIVE_UINT8;
    case DType::f64:
      return H5T_NATIVE_DOUBLE;
    case DType::f16:
    case DType::bf16:
      return H5T_NATIVE_UINT16;  // stored as their bits
  }
  return H5I_INVALID_HID;
}

std::optional<DType> dataset_dtype(hid_t ds) {
  H5Id type(H5_CHECK(H5Dget_type(ds)));
  const size_t size = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_FLOAT:
      if (size == 4) return DType::f32;
      break;
    case H5T_INTEGER: {
      const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
      if (size == 1 && !is_signed) return DType::u8;
      if (size == 4 && is_signed) return DType::i32;
      if (size == 8 && is_signed) return DType::i64;
      break;
    }
    default:
      break;
  }
  return std::nullopt;
}

void write_dataset(hid_t loc, const std::string& name, const Tensor& t, int64_t chunk_rows) {
  const std::vector<hsize_t> dims = t.shape.empty()
                                        ? std::vector<hsize_t>{1}
                                        : std::vector<hsize_t>(t.shape.begin(), t.shape.end());
  H5Id space(H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr)));
  H5Id dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  if (t.numel() > 0) {
    std::vector<hsize_t> chunk = dims;
    const hsize_t row_bytes = hsize_t(t.bytes()) / std::max<hsize_t>(dims[0], 1);
    hsize_t rows = chunk_rows > 0
                       ? hsize_t(chunk_rows)
                       : std::max<hsize_t>(1, (1u << 20) / std::max<hsize_t>(row_bytes, 1));
    chunk[0] = std::min(dims[0], rows);
    H5_CHECK(H5Pset_chunk(dcpl, int(chunk.size()), chunk.data()));
    H5_CHECK(H5Pset_fletcher32(dcpl));
  }
  H5Id ds(H5_CHECK(
      H5Dcreate2(loc, name.c_str(), h5_type(t.dtype), space, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
  if (t.numel() > 0)
    H5_CHECK(H5Dwrite(ds, h5_type(t.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data));
  ds.close(cat("dataset '", name, "'"));  // writes its cached chunks: a full disk shows here
}

namespace {
// HDF5 would convert any numeric type on the read (float64 to fp32, silently rounding); a
// file ringtrain wrote stores exactly the dtype it reads back, so another one is a foreign
// or damaged file.
void require_stored_dtype(hid_t ds, const std::string& name, DType want, const std::string& what) {
  const auto have = dataset_dtype(ds);
  if (have == want) return;
  H5Id type(H5_CHECK(H5Dget_type(ds)));
  const std::string stored = have ? std::string(dtype_name(*have))
                             : H5Tget_class(type) == H5T_FLOAT
                                 ? cat("float", 8 * H5Tget_size(type))
                                 : cat("a type of ", H5Tget_size(type), " bytes");
  throw_input(
      cat(what, ": dataset '", name, "' is stored as ", stored, "; expected ", dtype_name(want)));
}
}  // namespace

void read_dataset(hid_t loc, const std::string& name, const Tensor& dst, const std::string& what) {
  RT_REQUIRE(has_link(loc, name), what, " has no dataset '", name, "'");
  H5Id ds = open_dataset(loc, name);
  Shape shape = dataset_shape(ds);
  RT_REQUIRE(shape == dst.shape, what, ": dataset '", name, "' has shape ", shape_str(shape),
             "; expected ", shape_str(dst.shape));
  require_stored_dtype(ds, name, dst.dtype, what);
  if (dst.numel() == 0) return;
  herr_t rc = H5Dread(ds, h5_type(dst.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, dst.data);
  RT_REQUIRE(rc >= 0, what, ": dataset '", name, "' could not be read (", h5_error_stack(),
             "); the file may be corrupt");
}

namespace {
// Adds (OR) the flat range [lo, lo + n) below dimension d to the selection; the dimensions
// before d are fixed at start[k] (count 1).
void add_flat_range(hid_t space, const std::vector<hsize_t>& dims, size_t d,
                    std::vector<hsize_t>& start, std::vector<hsize_t>& count, hsize_t lo,
                    hsize_t n) {
  if (n == 0) return;
  hsize_t inner = 1;
  for (size_t k = d + 1; k < dims.size(); ++k) inner *= dims[k];
  const hsize_t off = lo % inner;
  if (off != 0 || n < inner) {  // a partial first row: recurse into it
    const hsize_t head = std::min(n, inner - off);
    start[d] = lo / inner;
    count[d] = 1;
    add_flat_range(space, dims, d + 1, start, count, off, head);
    lo += head;
    n -= head;
  }
  if (n >= inner) {  // whole rows
    start[d] = lo / inner;
    count[d] = n / inner;
    for (size_t k = d + 1; k < dims.size(); ++k) {
      start[k] = 0;
      count[k] = dims[k];
    }
    H5_CHECK(
        H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr));
    lo += count[d] * inner;
    n -= count[d] * inner;
  }
  if (n > 0) {  // a partial last row
    start[d] = lo / inner;
    count[d] = 1;
    add_flat_range(space, dims, d + 1, start, count, 0, n);
  }
}
}  // namespace

void select_flat_range(hid_t space, const Shape& shape, int64_t lo, int64_t n) {
  H5_CHECK(H5Sselect_none(space));
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  if (dims.empty()) dims = {1};
  std::vector<hsize_t> start(dims.size(), 0), count(dims.size(), 1);
  add_flat_range(space, dims, 0, start, count, hsize_t(lo), hsize_t(n));
}

void select_axis_ranges(hid_t space, const Shape& shape, int axis,
                        const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  H5_CHECK(H5Sselect_none(space));
  std::vector<hsize_t> start(shape.size(), 0), count(shape.begin(), shape.end());
  for (const auto& [b, e] : ranges) {
    start[size_t(axis)] = hsize_t(b);
    count[size_t(axis)] = hsize_t(e - b);
    H5_CHECK(
        H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr));
  }
}

void read_dataset_ranges(hid_t loc, const std::string& name, const Shape& shape, int axis,
                         const std::vector<std::pair<int64_t, int64_t>>& ranges, const Tensor& dst,
                         const std::string& what) {
  RT_REQUIRE(has_link(loc, name), what, " has no dataset '", name, "'");
  H5Id ds = open_dataset(loc, name);
  const Shape have = dataset_shape(ds);
  RT_REQUIRE(have == shape, what, ": dataset '", name, "' has shape ", shape_str(have),
             "; expected ", shape_str(shape));
  require_stored_dtype(ds, name, dst.dtype, what);
  const int64_t n = dst.numel();
  if (n == 0) return;
  H5Id fspace(H5_CHECK(H5Dget_space(ds)));
  select_axis_ranges(fspace, shape, axis, ranges);
  RT_CHECK(int64_t(H5Sget_select_npoints(fspace)) == n, "dataset '", name,
           "': ", H5Sget_select_npoints(fspace), " elements selected for a part of ", n);
  const hsize_t mdims[1] = {hsize_t(n)};
  H5Id mspace(H5_CHECK(H5Screate_simple(1, mdims, nullptr)));
  herr_t rc = H5Dread(ds, h5_type(dst.dtype), mspace, fspace, H5P_DEFAULT, dst.data);
  RT_REQUIRE(rc >= 0, what, ": dataset '", name, "' could not be read (", h5_error_stack(),
             "); the file may be corrupt");
}

void read_dataset_part(hid_t loc, const std::string& name, const Shape& shape, int64_t lo,
                       const Tensor& dst, const std::string& what) {
  RT_REQUIRE(has_link(loc, name), what, " has no dataset '", name, "'");
  H5Id ds = open_dataset(loc, name);
  const Shape have = dataset_shape(ds);
  RT_REQUIRE(have == shape, what, ": dataset '", name, "' has shape ", shape_str(have),
             "; expected ", shape_str(shape));
  require_stored_dtype(ds, name, dst.dtype, what);
  const int64_t n = dst.numel();
  if (n == 0) return;
  H5Id fspace(H5_CHECK(H5Dget_space(ds)));
  select_flat_range(fspace, shape, lo, n);
  const hsize_t mdims[1] = {hsize_t(n)};
  H5Id mspace(H5_CHECK(H5Screate_simple(1, mdims, nullptr)));
  herr_t rc = H5Dread(ds, h5_type(dst.dtype), mspace, fspace, H5P_DEFAULT, dst.data);
  RT_REQUIRE(rc >= 0, what, ": dataset '", name, "' could not be read (", h5_error_stack(),
             "); the file may be corrupt");
}

uint64_t fs_block_size(const std::string& path) {
  struct statvfs st {};
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return statvfs(dir.empty() ? "." : dir.c_str(), &st) == 0 && st.f_bsize > 0 ? uint64_t(st.f_bsize)
                                                                              : 4096;
}

uint64_t h5_file_bytes_bound(const std::vector<ChunkedExtent>& datasets, uint64_t block,
                             uint64_t attr_bytes) {
  // Measured on checkpoints of 12 to 171 datasets (mlp, cnn, resnet, ZeRO-1): HDF5's own
  // bytes were 3.2 to 3.7 KiB per dataset (object header, its link in a group, the chunk
  // B-tree node) plus about 40 KiB per file; the constants below are about twice that.
  // Each attribute's value is counted twice (an object header may be rewritten as it grows).
  uint64_t total = (64u << 10) + 2 * attr_bytes;
  for (const ChunkedExtent& d : datasets) {
    const uint64_t chunk = std::max<uint64_t>(d.chunk_bytes, 1);
    const uint64_t chunks = d.bytes == 0 ? 0 : (d.bytes + chunk - 1) / chunk;
    const uint64_t pad = chunk >= (64u << 10) ? block : 0;  // alignment of each chunk
    // 8 bytes a chunk: Fletcher32 and slack; one more B-tree node per 64 chunks.
    total += chunks * (chunk + 8 + pad) + (6u << 10) + (chunks / 64) * (4u << 10);
  }
  return total;
}

void fsync_path(const std::string& path, bool dir) {
  int fd = ::open(path.c_str(), O_RDONLY);
  RT_CHECK(fd >= 0, "open '", path, "' for fsync: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  RT_CHECK(rc == 0, "fsync '", path, "': ", std::strerror(err));
  if (dir)
    fsync_path(std::filesystem::path(path).parent_path().empty()
                   ? "."
                   : std::filesystem::path(path).parent_path().string(),
               false);
}

}  // namespace ringtrain::io
