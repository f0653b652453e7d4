// Checkpoint read/validate and the directory store: listing, newest valid, pruning (see
// checkpoint.hpp). The collective writer is in checkpoint_writer.cpp.
#include "io/checkpoint.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/env.hpp"
#include "io/checkpoint_schema.hpp"
#include "io/fletcher32.hpp"
#include "io/hdf5.hpp"
#include "io/meta_checksum.hpp"
#include "io/stats_check.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  H5Lock lock;
  H5Id f = open_file_readonly(path, "checkpoint");
  const std::string what = cat("checkpoint '", path, "'");
  auto format = read_attr_string(f, "format");
  RT_REQUIRE(format && *format == kCheckpointFormat, what,
             " is not a ringtrain checkpoint: root "
             "attribute 'format' is ",
             format ? "'" + *format + "'" : std::string("missing"), "; expected '",
             kCheckpointFormat, "'");
  auto version = read_attr_int(f, "format_version");
  RT_REQUIRE(version && *version == kCheckpointVersion, what, " has format_version ",
             version ? std::to_string(*version) : "missing", "; this ringtrain reads version ",
             kCheckpointVersion);
  CheckpointMeta m;
  read_checkpoint_attrs(f, "", m, what);
  for (const char* g : checkpoint_required_groups())
    RT_REQUIRE(has_link(f, g), what, " lacks the group /", g);
  for (const char* g : checkpoint_required_groups()) {
    H5Id group(H5_CHECK(H5Gopen2(f, g, H5P_DEFAULT)));
    read_checkpoint_attrs(group, g, m, what);
  }
  const std::string bad = impossible_meta(m);
  RT_REQUIRE(bad.empty(), what, " holds impossible metadata: ", bad);
  const std::string sum = meta_checksum_problem(f);
  RT_REQUIRE(sum.empty(), what, " is damaged: ", sum);
  return m;
}

namespace {
// Whether any value is NaN or inf, or has bits above negative_above (a value below 0 when
// that is 0x80000000). Compiled for AVX-512 and AVX2 as well: the scan runs over every byte a
// save writes and a resume reads.
__attribute__((target_clones("arch=skylake-avx512", "avx2", "default"))) bool any_impossible(
    const float* v, int64_t n, uint32_t negative_above) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, v + i, 4);
    bad |= uint32_t((bits & 0x7f800000u) == 0x7f800000u) | uint32_t(bits > negative_above);
  }
  return bad != 0;
}
}  // namespace

std::string impossible_values(const std::string& name, const float* v, int64_t n) {
  const bool squares = checkpoint_dataset_nonnegative(name);  // exp_avg_sq, running_var
  // NaN and inf have every exponent bit set, and a value below 0 has the sign bit and a
  // non-zero magnitude (bits above 0x80000000): one vectorisable integer OR over the values
  // finds either, and only when it does is the first bad index looked for. One pass
  // matters: on a save, this scan cost as much as the file system's copy of the data.
  if (!any_impossible(v, n, squares ? 0x80000000u : 0xffffffffu)) return "";
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) return cat("/", name, " holds ", v[i], " at index ", i);
    if (squares && v[i] < 0)
      return cat("/", name, " holds ", v[i], " at index ", i, "; expected >= 0");
  }
  return "";
}

void require_finite_for_save(const CheckpointMeta& meta, const std::vector<NamedTensor>& params,
                             const std::vector<OptimizerState>& optimizer,
                             const std::vector<NamedTensor>& buffers) {
  auto check = [&](const std::string& name, const Tensor& t) {
    const std::string bad = impossible_values(name, static_cast<const float*>(t.data), t.numel());
    if (!bad.empty())
      throw_runtime(__FILE__, __LINE__,
                    cat("refusing to save checkpoint step ", meta.step, ": ", bad,
                        " (the training diverged; the previous checkpoint is kept)"));
  };
  for (const auto& p : params) check("params/" + p.name, p.tensor);
  for (const auto& b : buffers) check("buffers/" + b.name, b.tensor);
  for (const auto& s : optimizer)
    for (const auto& p : s.per_param) check("optimizer/" + p.name + "/" + s.state, p.tensor);
  const std::string bad = impossible_meta(meta);
  if (!bad.empty())
    throw_runtime(__FILE__, __LINE__,
                  cat("refusing to save checkpoint step ", meta.step, ": ", bad));
}

namespace {

// Reads a whole fp32 dataset stored as the writer stores it (checkpoint_writer.cpp: chunks of
// whole rows along dim 0, Fletcher32 the only filter, every chunk allocated and unfiltered
// past the checksum) with one pread per chunk, verifying each chunk's Fletcher32 with
// io::fletcher32: the same check HDF5's filter makes, without its copy of every chunk and
// its scalar checksum loop. False (nothing read) for any other layout, which H5Dread reads.
// A chunk whose checksum does not match is an input error naming the dataset and chunk.
bool read_chunks_direct(hid_t f, int fd, const std::string& name, const Tensor& t,
                        const std::string& what) {
  if (fd < 0 || t.dtype != DType::f32 || t.numel() == 0 || !has_link(f, name)) return false;
  H5Id ds(H5Dopen2(f, name.c_str(), H5P_DEFAULT));
  if (ds.get() < 0) return false;
  H5Id type(H5Dget_type(ds)), space(H5Dget_space(ds)), dcpl(H5Dget_create_plist(ds));
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 1 || H5Tequal(type, H5T_IEEE_F32LE) <= 0 || H5Pget_layout(dcpl) != H5D_CHUNKED ||
      H5Pget_nfilters(dcpl) != 1)
    return false;
  unsigned flags = 0;
  size_t nvalues = 0;
  if (H5Pget_filter2(dcpl, 0, &flags, &nvalues, nullptr, 0, nullptr, nullptr) !=
      H5Z_FILTER_FLETCHER32)
    return false;
  std::vector<hsize_t> dims(static_cast<size_t>(rank)), chunk(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  if (H5Pget_chunk(dcpl, rank, chunk.data()) != rank || Shape(dims.begin(), dims.end()) != t.shape)
    return false;
  for (int k = 1; k < rank; ++k)
    if (chunk[size_t(k)] != dims[size_t(k)]) return false;
  const size_t row_bytes = t.bytes() / dims[0], chunk_bytes = size_t(chunk[0]) * row_bytes;
  const hsize_t nchunks = (dims[0] + chunk[0] - 1) / chunk[0];
  hsize_t stored_chunks = 0;
  if (H5Dget_num_chunks(ds, space, &stored_chunks) < 0 || stored_chunks != nchunks) return false;
  // Every chunk's address first: a layout that differs anywhere is read by HDF5 instead.
  std::vector<haddr_t> addr(nchunks);
  std::vector<hsize_t> offset(size_t(rank), 0);
  for (hsize_t c = 0; c < nchunks; ++c) {
    offset[0] = c * chunk[0];
    unsigned mask = 0;
    hsize_t size = 0;
    if (H5Dget_chunk_info_by_coord(ds, offset.data(), &mask, &addr[c], &size) < 0 ||
        addr[c] == HADDR_UNDEF || mask != 0 || size != chunk_bytes + 4)
      return false;
  }
  std::vector<unsigned char> edge;
  auto* base = static_cast<unsigned char*>(t.data);
  for (hsize_t c = 0; c < nchunks; ++c) {
    const size_t have = size_t(std::min(chunk[0], dims[0] - c * chunk[0])) * row_bytes;
    unsigned char* dst = base + c * chunk_bytes;
    if (have < chunk_bytes) {  // the last chunk, stored whole: read it aside
      edge.resize(chunk_bytes);
      dst = edge.data();
    }
    unsigned char sum[4];
    size_t done = 0;
    while (done < chunk_bytes + 4) {
      // Whatever is left of the two pieces, from where the last read stopped.
      iovec rest[2];
      int n = 0;
      if (done < chunk_bytes) rest[n++] = iovec{dst + done, chunk_bytes - done};
      const size_t sum_done = done > chunk_bytes ? done - chunk_bytes : 0;
      rest[n++] = iovec{sum + sum_done, 4 - sum_done};
      const ssize_t got = ::preadv(fd, rest, n, off_t(addr[c] + done));
      if (got < 0 && errno == EINTR) continue;
      RT_REQUIRE(got > 0, what, ": dataset '", name, "' could not be read (chunk ", c, ": ",
                 got < 0 ? std::strerror(errno) : "the file ends inside it",
                 "); the file may be corrupt");
      done += size_t(got);
    }
    const uint32_t stored =
        uint32_t(sum[0]) | uint32_t(sum[1]) << 8 | uint32_t(sum[2]) << 16 | uint32_t(sum[3]) << 24;
    RT_REQUIRE(fletcher32(dst, chunk_bytes) == stored, what, ": dataset '", name,
               "' could not be read (chunk ", c,
               " fails its Fletcher32 checksum); the file may be corrupt");
    if (dst != base + c * chunk_bytes) std::memcpy(base + c * chunk_bytes, dst, have);
  }
  return true;
}

// Reads the fp32 dataset `name` into t and rejects impossible values (input error naming
// the file and the tensor). `fd`: the file opened for read_chunks_direct, or -1.
void read_checked(hid_t f, int fd, const std::string& path, const std::string& name,
                  const NamedTensor& nt) {
  const std::string what = cat("checkpoint '", path, "'");
  const Tensor& t = nt.tensor;
  if (nt.full_shape.empty()) {
    if (!read_chunks_direct(f, fd, name, t, what)) read_dataset(f, name, t, what);
  } else if (nt.split_axis >= 0)
    read_dataset_ranges(f, name, nt.full_shape, nt.split_axis, nt.split_ranges, t, what);
  else
    read_dataset_part(f, name, nt.full_shape, nt.part_offset, t, what);
  const std::string bad = impossible_values(name, static_cast<const float*>(t.data), t.numel());
  RT_REQUIRE(bad.empty(), what, " is damaged: ", bad);
}

}  // namespace

namespace {
// The checkpoint opened for direct chunk reads (-1 with RINGTRAIN_CHECKPOINT_DIRECT=0, or
// when it cannot be opened: then HDF5 reads everything).
struct DirectFd {
  explicit DirectFd(const std::string& path)
      : fd(env::checkpoint_direct() ? ::open(path.c_str(), O_RDONLY | O_CLOEXEC) : -1) {}
  ~DirectFd() {
    if (fd >= 0) ::close(fd);
  }
  DirectFd(const DirectFd&) = delete;
  DirectFd& operator=(const DirectFd&) = delete;
  int fd;
};
}  // namespace

void read_checkpoint_params(const std::string& path, const std::vector<NamedTensor>& params) {
  H5Lock lock;
  H5Id f = open_file_readonly(path, "checkpoint");
  DirectFd direct(path);
  for (const auto& p : params) read_checked(f, direct.fd, path, "params/" + p.name, p);
}

void read_checkpoint_buffers(const std::string& path, const std::vector<NamedTensor>& buffers) {
  H5Lock lock;
  H5Id f = open_file_readonly(path, "checkpoint");
  DirectFd direct(path);
  for (const auto& b : buffers) read_checked(f, direct.fd, path, "buffers/" + b.name, b);
}

void read_checkpoint_optimizer(const std::string& path, const std::vector<OptimizerState>& states) {
  H5Lock lock;
  H5Id f = open_file_readonly(path, "checkpoint");
  DirectFd direct(path);
  for (const auto& s : states)
    for (const auto& p : s.per_param)
      read_checked(f, direct.fd, path, "optimizer/" + p.name + "/" + s.state, p);
}

namespace {

// Visits every dataset below the root and reads it whole: HDF5 verifies the Fletcher32
// checksum of each chunk on the way; float datasets are read as fp32 and their values
// checked (impossible_values).
herr_t read_all(hid_t loc, const char* name, const H5O_info_t* info, void* ok) {
  if (info->type != H5O_TYPE_DATASET) return 0;
  auto* problem = static_cast<std::string*>(ok);
  H5Id ds(H5Dopen2(loc, name, H5P_DEFAULT));
  if (ds.get() < 0) return -1;
  H5Id space(H5Dget_space(ds));
  H5Id type(H5Dget_type(ds));
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  const bool is_float = H5Tget_class(type) == H5T_FLOAT;
  const hid_t mem = is_float ? H5T_NATIVE_FLOAT : type.get();
  std::vector<char> buf(size_t(std::max<hssize_t>(n, 1)) * H5Tget_size(mem));
  if (n > 0 && H5Dread(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0) {
    *problem = cat("dataset '", name, "' fails its checksum or cannot be read");
    return -1;
  }
  if (is_float && n > 0) {
    *problem = impossible_values(name, reinterpret_cast<const float*>(buf.data()), n);
    if (!problem->empty()) return -1;
  }
  return 0;
}

}  // namespace

bool validate_checkpoint(const std::string& path, std::string* why,
                         const std::vector<NamedTensor>& expected) {
  H5Lock lock;
  try {
    read_checkpoint_meta(path);
    H5Id f = open_file_readonly(path, "checkpoint");
    for (const auto& p : expected) {
      RT_REQUIRE(has_link(f, p.name), "it has no dataset /", p.name);
      H5Id ds = open_dataset(f, p.name);
      RT_REQUIRE(dataset_dtype(ds) == DType::f32 && dataset_shape(ds) == p.logical_shape(), "/",
                 p.name, " is not fp32 ", shape_str(p.logical_shape()));
    }
    std::string problem;
    if (H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_NATIVE, read_all, &problem, H5O_INFO_BASIC) < 0) {
      if (why) *why = problem.empty() ? h5_error_stack() : problem;
      return false;
    }
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

CheckpointStore::CheckpointStore(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {
  RT_REQUIRE(keep >= 1, "--keep ", keep, " is not valid; keep at least 1 checkpoint");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  RT_REQUIRE(!ec && fs::is_directory(dir_), "--checkpoint-dir '", dir_,
             "' cannot be created or is not a directory", ec ? ": " + ec.message() : "");
}

CheckpointStore::~CheckpointStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

std::string CheckpointStore::lock() {
  if (lock_fd_ >= 0) return "";
  const std::string path = (fs::path(dir_) / ".lock").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  RT_REQUIRE(fd >= 0, "--checkpoint-dir '", dir_, "': cannot open the lock file '", path,
             "': ", std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {  // e.g. a Lustre mount without the flock option
      ::close(fd);
      return cat("cannot lock '", path, "' (", std::strerror(err),
                 "); this job runs without protection against a second job on --checkpoint-dir '",
                 dir_, "'");
    }
    std::string holder;
    std::getline(std::ifstream(path), holder);
    ::close(fd);
    std::string host = "?", pid = "?";
    if (const size_t sp = holder.find(' '); sp != std::string::npos) {
      host = holder.substr(0, sp);
      pid = holder.substr(sp + 1);
    }
    throw_input(cat("--checkpoint-dir '", dir_, "' is in use by another ringtrain job (host ", host,
                    ", pid ", pid, ", holding '", path,
                    "'); wait for it to end or use another --checkpoint-dir"));
  }
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const std::string who = cat(host, " ", getpid(), "\n");
  // Who holds it, for the message of a second job; the lock itself is the flock.
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, who.data(), who.size(), 0) != ssize_t(who.size())) {
    const int err = errno;
    ::close(fd);
    RT_REQUIRE(false, "--checkpoint-dir '", dir_, "': cannot write the lock file '", path,
               "': ", std::strerror(err));
  }
  lock_fd_ = fd;
  return "";
}

std::string CheckpointStore::path_for(int64_t step) const {
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%09lld.h5", static_cast<long long>(step));
  return (fs::path(dir_) / name).string();
}

std::vector<std::string> CheckpointStore::list() const {
  static const std::regex name_re(R"(ckpt-(\d{9})\.h5)");
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && std::regex_match(name, name_re)) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());  // 9-digit steps sort by name
  return out;
}

std::vector<std::string> CheckpointStore::list_invalid() const {
  static const std::regex name_re(R"(ckpt-(\d{9})\.h5\.invalid)");
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (std::regex_match(e.path().filename().string(), name_re)) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> CheckpointStore::latest_valid(
    std::vector<std::pair<std::string, std::string>>* skipped,
    const std::vector<NamedTensor>& expected,
    const std::function<void(const std::string&, const CheckpointMeta&)>& same_run) const {
  auto files = list();
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    std::string why;
    std::optional<CheckpointMeta> m;
    try {
      m = read_checkpoint_meta(*it);
    } catch (const Error& e) {
      why = e.what();
    }
    if (m) {
      if (same_run) same_run(*it, *m);  // an intact file of another run: its error propagates
      if (validate_checkpoint(*it, &why, expected)) return *it;
    }
    if (skipped) skipped->push_back({*it, why});
  }
  return std::nullopt;
}

void CheckpointStore::prune(const std::string& keep_this) {
  auto files = list();
  files.erase(std::remove(files.begin(), files.end(), keep_this), files.end());
  // The file just written always stays, plus the newest keep-1 of the others.
  for (size_t i = 0; i + size_t(keep_ - 1) < files.size(); ++i) {
    std::error_code ec;
    fs::remove(files[i], ec);
  }
  // A .tmp left by a killed save is never a checkpoint; remove stale ones too. Only under
  // the directory's lock: then no other job writes here, and this job's own save has
  // renamed its file before pruning, so every .tmp is stale.
  if (lock_fd_ < 0) return;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (e.path().extension() == ".tmp" && e.path().stem().extension() == ".h5")
      fs::remove(e.path(), ec);
}

}  // namespace ringtrain::io
