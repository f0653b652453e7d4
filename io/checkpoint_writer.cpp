// The checkpoint writer: one HDF5 file per save, created by all ranks together with
// parallel HDF5 (MPI-IO driver, collective metadata, collective transfers, objects aligned
// to the file system's block). Every dataset is chunked (about 1 MiB, chunks of equal rows)
// with Fletcher32 checksums; rank r of W writes the r-th W-th of the chunks of each
// replicated dataset, its own row of each per-rank dataset, and its part of each sharded one
// (ZeRO-1's optimizer state: hyperslabs of the same full-shape dataset). Then rank 0 fsyncs the
// .tmp file, renames it into place, fsyncs the directory and prunes old checkpoints.
//
// Whole chunks are stored directly: the replicated and per-rank datasets are allocated when
// created (H5D_ALLOC_TIME_EARLY, collective, so every rank sees the same chunk addresses, each
// chunk sized for its data and its 4-byte Fletcher32, and filled by HDF5), and after a
// barrier each rank writes its chunks with pwritev() at those addresses: the data straight
// from the tensor and the checksum computed by io::fletcher32, the value HDF5's filter would
// append. That skips HDF5's filter pipeline, which copies every chunk into a fresh buffer and
// checksums it with a scalar loop (docs/benchmarks.md, checkpoint_bench). HDF5 still writes
// all metadata, and a reader sees an ordinary file whose checksums it verifies. Where HDF5
// did not allocate a dataset's chunks as expected, and for sharded tensors (whose parts do
// not fall on chunk boundaries), the data goes through H5Dwrite; RINGTRAIN_CHECKPOINT_DIRECT=0
// sends everything through it.
//
// A full file system must end the save on every rank alike. HDF5 cannot promise that: when
// one rank's write fails inside its collective metadata flush, that rank skips the flush's
// barrier and goes on to the next collective while the others wait at it, for ever. So the
// save first reserves room for the whole file (rank 0, fallocate beyond the end of the empty
// .tmp, io/output_file.hpp) and every rank learns the outcome before HDF5 writes a byte; a
// save that does not fit ends there, on every rank, with one message. The writes that follow
// fall inside the reservation. This rank's own writes (the direct chunks, their fdatasync)
// record a failure instead of throwing it, so that every rank still makes the same HDF5
// calls; the ranks agree on any failure before the flush, again after the close, and on
// rank 0's fsync and rename, and all end with the same message. The .tmp is removed; the
// checkpoints already in the directory are untouched.
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/env.hpp"
#include "core/fault_injection.hpp"
#include "io/checkpoint.hpp"
#include "io/checkpoint_schema.hpp"
#include "io/fletcher32.hpp"
#include "io/hdf5.hpp"
#include "io/meta_checksum.hpp"
#include "io/mpi_check.hpp"
#include "io/output_file.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {
namespace {

constexpr hsize_t kChunkBytes = 1 << 20;

class Writer {
 public:
  Writer(MPI_Comm comm, int64_t step) : comm_(comm), step_(step) {
    if (comm_ != MPI_COMM_NULL) {
      MPI_Comm_rank(comm_, &rank_);
      MPI_Comm_size(comm_, &size_);
    }
    dxpl_ = H5Id(H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
    if (comm_ != MPI_COMM_NULL) H5_CHECK(H5Pset_dxpl_mpio(dxpl_, H5FD_MPIO_COLLECTIVE));
  }

  ~Writer() {
    if (fd_ >= 0) ::close(fd_);
  }

  H5Id create(const std::string& path) {
    H5Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
    if (comm_ != MPI_COMM_NULL) {
      H5_CHECK(H5Pset_fapl_mpio(fapl, comm_, MPI_INFO_NULL));
      H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, true));
      H5_CHECK(H5Pset_coll_metadata_write(fapl, true));
    }
    // Large objects start on a file-system block, so no two writers share a block.
    H5_CHECK(H5Pset_alignment(fapl, 64 * 1024, fs_block_size(path)));
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (f < 0)
      throw_runtime(__FILE__, __LINE__,
                    cat("cannot create checkpoint '", path, "': ", h5_error_stack()));
    path_ = path;
    // Direct chunk writes only when every rank can make them: the choice decides whether
    // H5Dwrite (collective) is called, so it must be the same everywhere.
    if (env::checkpoint_direct()) fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    int ok = fd_ >= 0;
    if (comm_ != MPI_COMM_NULL)
      IO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm_));
    direct_ = ok != 0;
    return H5Id(f);
  }

  // After the last dataset: this rank's direct writes reach the disk before rank 0 renames
  // the file (rank 0 fsyncs it too, but on a parallel file system each client flushes its
  // own writes). A failure is recorded (failure()), not thrown.
  void finish() {
    if (fd_ < 0) return;
    H5Unlock no_hdf5_here;
    if (direct_chunks_ > 0 && failure_.empty() && ::fdatasync(fd_) != 0)
      failure_ = cat("fdatasync '", path_, "': ", std::strerror(errno));
    if (::close(fd_) != 0 && failure_.empty())
      failure_ = cat("close '", path_, "': ", std::strerror(errno));
    fd_ = -1;
  }
  int64_t direct_chunks() const { return direct_chunks_; }
  // This rank's first failed direct write, fdatasync or close ("" when none): the ranks
  // agree on it before the next collective that could be skipped (see save()).
  const std::string& failure() const { return failure_; }

  // Equal chunks of about kChunkBytes along the first dimension: the rows of one chunk.
  static hsize_t chunk_rows_of(const Shape& shape, DType dtype) {
    const hsize_t rows = hsize_t(shape[0]);
    const hsize_t row_bytes =
        hsize_t(shape_numel(shape)) * dtype_size(dtype) / std::max<hsize_t>(rows, 1);
    const hsize_t chunks_needed =
        std::max<hsize_t>(1, (rows * row_bytes + kChunkBytes - 1) / kChunkBytes);
    return std::max<hsize_t>(1, (rows + chunks_needed - 1) / chunks_needed);
  }

  // A dataset of t's shape; every rank passes the same (replicated) values.
  void replicated(hid_t loc, const std::string& name, const Tensor& t) {
    Shape shape = t.shape.empty() ? Shape{1} : t.shape;
    const hsize_t rows = hsize_t(shape[0]);
    const hsize_t chunk_rows = chunk_rows_of(shape, t.dtype);
    const hsize_t nchunks = rows == 0 ? 0 : (rows + chunk_rows - 1) / chunk_rows;
    const hsize_t c_lo = nchunks * hsize_t(rank_) / hsize_t(size_);
    const hsize_t c_hi = nchunks * hsize_t(rank_ + 1) / hsize_t(size_);
    write(loc, name, t, shape, chunk_rows, std::min(rows, c_lo * chunk_rows),
          std::min(rows, c_hi * chunk_rows));
  }

  // A sharded tensor: the full-shape dataset (chunked as if replicated), of which this rank
  // writes its part, the flat range [part_offset, part_offset + numel) as hyperslabs.
  void sharded(hid_t loc, const std::string& name, const NamedTensor& nt) const {
    const Shape shape = nt.full_shape;
    const Tensor& t = nt.tensor;
    H5Id ds = create(loc, name, t.dtype, shape, chunk_rows_of(shape, t.dtype));
    if (shape_numel(shape) == 0) return;
    H5Id fspace(H5_CHECK(H5Dget_space(ds)));
    const bool none = t.numel() == 0 || !nt.writes;
    if (none)
      H5_CHECK(H5Sselect_none(fspace));
    else if (nt.split_axis >= 0)
      select_axis_ranges(fspace, shape, nt.split_axis, nt.split_ranges);
    else
      select_flat_range(fspace, shape, nt.part_offset, t.numel());
    const hsize_t mdims[1] = {hsize_t(std::max<int64_t>(t.numel(), 1))};
    H5Id mspace(H5_CHECK(H5Screate_simple(1, mdims, nullptr)));
    if (none) H5_CHECK(H5Sselect_none(mspace));  // still a collective transfer
    H5_CHECK(H5Dwrite(ds, h5_type(t.dtype), mspace, fspace, dxpl_, t.data));
  }

  // A dataset [W, row...] of which this rank writes row `rank`.
  void per_rank(hid_t loc, const std::string& name, const Tensor& row) {
    Shape shape = {size_};
    shape.insert(shape.end(), row.shape.begin(), row.shape.end());
    write(loc, name,
          Tensor(static_cast<char*>(row.data) - rank_ * int64_t(row.bytes()), shape, row.dtype),
          shape, 1, hsize_t(rank_), hsize_t(rank_) + 1);
  }

 private:
  // Creates name with `shape`, chunked by chunk_rows along the first dimension, Fletcher32,
  // its chunks allocated (and filled by HDF5) at creation when chunks are written directly.
  H5Id create(hid_t loc, const std::string& name, DType dtype, const Shape& shape,
              hsize_t chunk_rows) const {
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    H5Id fspace(H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr)));
    H5Id dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
    std::vector<hsize_t> chunk = dims;
    chunk[0] = std::max<hsize_t>(1, std::min(chunk_rows, dims[0]));
    if (shape_numel(shape) != 0) {
      H5_CHECK(H5Pset_chunk(dcpl, int(chunk.size()), chunk.data()));
      H5_CHECK(H5Pset_fletcher32(dcpl));
      H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
      if (direct_) H5_CHECK(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
    }
    return H5Id(H5_CHECK(
        H5Dcreate2(loc, name.c_str(), h5_type(dtype), fspace, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
  }

  // Creates name with `shape` (see create) and writes rows [lo, hi) of it from t.data (which
  // views the whole dataset).
  void write(hid_t loc, const std::string& name, const Tensor& t, const Shape& shape,
             hsize_t chunk_rows, hsize_t lo, hsize_t hi) {
    H5Id ds = create(loc, name, t.dtype, shape, chunk_rows);
    if (shape_numel(shape) == 0) return;
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    if (direct_) {
      const size_t row_bytes = t.bytes() / dims[0];
      const std::vector<haddr_t> addr =
          chunk_addresses(ds, dims, chunk_rows, chunk_rows * row_bytes + 4);
      if (!addr.empty()) {
        // HDF5 filled every chunk when it allocated them (it always does for a filtered
        // dataset, each rank writing some chunks' fill); only after every rank's share of
        // that has been written may a rank overwrite its chunks with the data.
        H5Unlock no_hdf5_here;  // the wait and the data writes make no HDF5 call
        if (comm_ != MPI_COMM_NULL) IO_MPI_CHECK(MPI_Barrier(comm_));
        return write_chunks(name, t, dims[0], chunk_rows, row_bytes, lo, hi, addr);
      }
    }
    H5Id fspace(H5_CHECK(H5Dget_space(ds)));
    std::vector<hsize_t> start(dims.size(), 0), count = dims;
    start[0] = lo;
    count[0] = hi - lo;
    H5Id mspace(H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr)));
    if (hi > lo) {
      H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, count.data(),
                                   nullptr));
      H5_CHECK(H5Sselect_hyperslab(mspace, H5S_SELECT_SET, start.data(), nullptr, count.data(),
                                   nullptr));
    } else {  // nothing of this dataset is ours, but the transfer is collective
      H5_CHECK(H5Sselect_none(fspace));
      H5_CHECK(H5Sselect_none(mspace));
    }
    H5_CHECK(H5Dwrite(ds, h5_type(t.dtype), mspace, fspace, dxpl_, t.data));
  }

  // The file address of every chunk of ds (chunk_rows rows each), when HDF5
  // allocated each at `stored` bytes (the data's and 4 of Fletcher32); else empty. Every rank
  // looks up every chunk in the same order (collective metadata reads) and so gets the same
  // answer.
  static std::vector<haddr_t> chunk_addresses(hid_t ds, const std::vector<hsize_t>& dims,
                                              hsize_t chunk_rows, hsize_t stored) {
    const hsize_t nchunks = (dims[0] + chunk_rows - 1) / chunk_rows;
    std::vector<haddr_t> addr(nchunks);
    std::vector<hsize_t> offset(dims.size(), 0);
    for (hsize_t c = 0; c < nchunks; ++c) {
      offset[0] = c * chunk_rows;
      unsigned mask = 0;
      haddr_t a = HADDR_UNDEF;
      hsize_t size = 0;
      if (H5Dget_chunk_info_by_coord(ds, offset.data(), &mask, &a, &size) < 0 || a == HADDR_UNDEF ||
          size != stored || mask != 0)
        return {};
      addr[c] = a;
    }
    return addr;
  }

  // Rows [lo, hi) of t, whole chunks, each stored at addr[chunk] as data + Fletcher32
  // (little-endian, as HDF5's filter appends it). A last chunk with fewer rows is stored
  // whole, its missing rows as zeros.
  void write_chunks(const std::string& name, const Tensor& t, hsize_t rows, hsize_t chunk_rows,
                    size_t row_bytes, hsize_t lo, hsize_t hi, const std::vector<haddr_t>& addr) {
    const size_t chunk_bytes = size_t(chunk_rows) * row_bytes;
    RT_CHECK(lo % chunk_rows == 0 && (hi % chunk_rows == 0 || hi == rows), "checkpoint dataset '",
             name, "': rows [", lo, ", ", hi, ") are not whole chunks of ", chunk_rows);
    std::vector<unsigned char> edge;
    for (hsize_t r = lo; r < hi; r += chunk_rows) {
      const auto* src = static_cast<const unsigned char*>(t.data) + r * row_bytes;
      const size_t have = size_t(std::min(chunk_rows, rows - r)) * row_bytes;
      if (have < chunk_bytes) {
        edge.assign(chunk_bytes, 0);
        std::memcpy(edge.data(), src, have);
        src = edge.data();
      }
      unsigned char sum[4];
      const uint32_t f = fletcher32(src, chunk_bytes);
      for (int i = 0; i < 4; ++i) sum[i] = static_cast<unsigned char>(f >> (8 * i));
      if (!pwrite_all(name, {{const_cast<unsigned char*>(src), chunk_bytes}, {sum, 4}},
                      off_t(addr[r / chunk_rows])))
        return;
      ++direct_chunks_;
    }
  }

  // Writes the whole of iov at `at`; false (the failure recorded) when it cannot, or when an
  // earlier write of this save failed.
  bool pwrite_all(const std::string& name, std::vector<iovec> iov, off_t at) {
    if (!failure_.empty()) return false;
    size_t first = 0;
    while (first < iov.size()) {
      ssize_t n = ::pwritev(fd_, iov.data() + first, int(iov.size() - first), at);
      if (fault_requested("savewrite", step_)) {  // tests: as if the disk were full
        n = -1;
        errno = ENOSPC;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        failure_ = cat("writing dataset '", name, "' to '", path_,
                       "': ", n < 0 ? std::strerror(errno) : "no progress");
        return false;
      }
      at += n;
      for (size_t left = size_t(n); left > 0;) {
        const size_t step = std::min(left, iov[first].iov_len);
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + step;
        iov[first].iov_len -= step;
        left -= step;
        if (iov[first].iov_len == 0) ++first;
      }
    }
    return true;
  }

  MPI_Comm comm_;
  int64_t step_;  // of the checkpoint, for RINGTRAIN_TEST_FAIL
  int rank_ = 0, size_ = 1;
  H5Id dxpl_;
  std::string path_;
  int fd_ = -1;          // the .tmp file, for direct chunk writes
  bool direct_ = false;  // every rank has fd_ and RINGTRAIN_CHECKPOINT_DIRECT is not 0
  int64_t direct_chunks_ = 0;
  std::string failure_;
};

// Creates the groups of a path like "optimizer/fc1.weight/exp_avg" that do not exist yet.
void ensure_parents(hid_t file, const std::string& path) {
  for (size_t pos = path.find('/'); pos != std::string::npos; pos = path.find('/', pos + 1)) {
    const std::string g = path.substr(0, pos);
    if (!has_link(file, g)) create_group(file, g);
  }
}

// The first failure of any rank (the lowest failing rank's text) on every rank; "" when no
// rank failed. Collective over comm.
std::string failure_anywhere(MPI_Comm comm, const std::string& mine) {
  if (comm == MPI_COMM_NULL) return mine;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int first = mine.empty() ? size : rank;
  IO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == size) return "";
  std::string text = mine;
  int len = int(text.size());
  IO_MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, first, comm));
  text.resize(size_t(len));
  IO_MPI_CHECK(MPI_Bcast(text.data(), len, MPI_CHAR, first, comm));
  return text;
}

}  // namespace

uint64_t checkpoint_bytes_bound(const CheckpointMeta& m, const std::vector<NamedTensor>& params,
                                const std::vector<OptimizerState>& optimizer,
                                const std::vector<NamedTensor>& per_rank,
                                const std::vector<NamedTensor>& buffers, int world,
                                uint64_t block) {
  std::vector<ChunkedExtent> extents;
  auto add = [&](const Shape& logical, DType dtype, bool one_row_chunks) {
    const Shape shape = logical.empty() ? Shape{1} : logical;
    const uint64_t bytes = uint64_t(shape_numel(shape)) * dtype_size(dtype);
    const uint64_t rows = uint64_t(std::max<int64_t>(shape[0], 1));
    const uint64_t chunk_rows = one_row_chunks ? 1 : Writer::chunk_rows_of(shape, dtype);
    extents.push_back({bytes, chunk_rows * (bytes / rows)});
  };
  for (const auto& p : params) add(p.logical_shape(), p.tensor.dtype, false);
  for (const auto& b : buffers) add(b.logical_shape(), b.tensor.dtype, false);
  for (const auto& s : optimizer)
    for (const auto& p : s.per_param) add(p.logical_shape(), p.tensor.dtype, false);
  for (const auto& p : per_rank) {
    Shape shape = {world};
    shape.insert(shape.end(), p.tensor.shape.begin(), p.tensor.shape.end());
    add(shape, p.tensor.dtype, true);
  }
  const uint64_t attrs = m.model.size() + m.plugins.size() + m.precision.size() +
                         m.optimizer.size() + m.ringtrain_version.size() +
                         16 * m.input_channel_mean.size() + (4u << 10);
  return h5_file_bytes_bound(extents, block, attrs);
}

namespace {

// The save of one file at final_path (see CheckpointStore::save); `kept` says in a failure
// message what stays untouched, `after_commit` runs on rank 0 once the file is in place.
uint64_t save_file(MPI_Comm comm, const std::string& final_path, const std::string& kept,
                   const CheckpointMeta& m, const std::vector<NamedTensor>& params,
                   const std::vector<OptimizerState>& optimizer,
                   const std::vector<NamedTensor>& per_rank,
                   const std::vector<NamedTensor>& buffers, int64_t* direct_chunks_out,
                   const std::function<void(const std::string&)>& after_commit) {
  require_finite_for_save(m, params, optimizer, buffers);     // before any file is created
  std::unique_lock<std::recursive_mutex> hdf5(hdf5_mutex());  // H5Lock, released to commit
  int64_t& direct_chunks_ = *direct_chunks_out;
  direct_chunks_ = 0;
  int rank = 0, size = 1;
  if (comm != MPI_COMM_NULL) {
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
  }
  const std::string tmp = final_path + ".tmp";
  // Every rank ends an agreed failure the same way: rank 0 removes the .tmp, all throw (the
  // message first: the free space it names is the space the save met).
  auto fail_agreed = [&](const std::string& why) {
    const std::string message = failed_for_space(tmp, why)
                                    ? disk_full_message("saving checkpoint", final_path, kept)
                                    : cat("saving checkpoint '", tmp, "' failed: ", why);
    if (rank == 0) remove_quietly(tmp);
    throw Error(ErrorKind::runtime, message);
  };

  // Room for the whole file, reserved before HDF5 writes anything (see the top of the file).
  int reserved = 0;
  if (rank == 0)
    reserved = reserve_output(tmp, checkpoint_bytes_bound(m, params, optimizer, per_rank, buffers,
                                                          size, fs_block_size(tmp)));
  if (comm != MPI_COMM_NULL) IO_MPI_CHECK(MPI_Bcast(&reserved, 1, MPI_INT, 0, comm));
  if (reserved != 0) fail_agreed(cat("creating it: ", std::strerror(reserved)));

  std::string failure;  // agreed across ranks
  try {
    CollectiveFileScope collective;  // destroyed last: the handles below are inside it
    Writer w(comm, m.step);
    H5Id f = w.create(tmp);
    // The attributes come from the schema's table, in its order; each group's are written at
    // the point below where they always were, since the order of writes shapes the file.
    write_checkpoint_attrs(f, "", m);
    for (const char* g : checkpoint_required_groups()) create_group(f, g);
    for (const auto& p : params) {
      if (p.full_shape.empty())
        w.replicated(f, "params/" + p.name, p.tensor);
      else
        w.sharded(f, "params/" + p.name, p);
    }
    maybe_inject_fault("save", m.step);  // between collective writes
    if (const int64_t ms = env::test_save_delay_ms(); ms > 0) {
      H5Unlock no_hdf5_here;
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    }
    if (!buffers.empty()) create_group(f, "buffers");
    for (const auto& b : buffers) w.replicated(f, "buffers/" + b.name, b.tensor);
    H5Id og(H5_CHECK(H5Gopen2(f, "optimizer", H5P_DEFAULT)));
    write_checkpoint_attrs(og, "optimizer", m);
    for (const auto& s : optimizer)
      for (const auto& p : s.per_param) {
        const std::string name = "optimizer/" + p.name + "/" + s.state;
        ensure_parents(f, name);
        if (p.full_shape.empty())
          w.replicated(f, name, p.tensor);
        else
          w.sharded(f, name, p);
      }
    H5Id ls(H5_CHECK(H5Gopen2(f, "loss_scaler", H5P_DEFAULT)));
    write_checkpoint_attrs(ls, "loss_scaler", m);
    H5Id dg(H5_CHECK(H5Gopen2(f, "data", H5P_DEFAULT)));
    write_checkpoint_attrs(dg, "data", m);
    H5Id rg(H5_CHECK(H5Gopen2(f, "rng", H5P_DEFAULT)));
    write_checkpoint_attrs(rg, "rng", m);
    for (const auto& p : per_rank) {
      ensure_parents(f, p.name);
      w.per_rank(f, p.name, p.tensor);
    }
    write_meta_checksum(f);  // after the last attribute
    w.finish();
    direct_chunks_ = w.direct_chunks();
    // Agreed before the flush: a rank whose direct write failed must not leave the others
    // in the flush's collectives.
    failure = failure_anywhere(comm, w.failure());
    std::string mine;
    // With MPI-IO, the flush syncs every rank's data; skipped (by every rank) after a failure.
    if (failure.empty() && H5Fflush(f, H5F_SCOPE_GLOBAL) < 0)
      mine = cat("H5Fflush: ", h5_error_stack());
    if (failure.empty() && fault_requested("saveflush", m.step))
      mine = cat("H5Fflush: ", std::strerror(ENOSPC), " (RINGTRAIN_TEST_FAIL)");
    for (H5Id* id : {&og, &ls, &dg, &rg}) id->reset();
    // Closing is collective: every rank closes, whatever happened; checked, as it writes.
    if (f.close_status() < 0 && mine.empty()) mine = cat("H5Fclose: ", h5_error_stack());
    if (failure.empty()) failure = failure_anywhere(comm, mine);
  } catch (const Error& e) {
    // A failed HDF5 call on this rank (H5_CHECK): the job ends from here (launch's
    // fail_job); the handles stay open (see H5Id), the .tmp is pruned by the next save.
    if (failed_for_space(tmp, e.what())) throw_disk_full("saving checkpoint", final_path, kept);
    throw Error(ErrorKind::runtime, cat("saving checkpoint '", tmp, "' failed: ", e.what()));
  }
  if (!failure.empty()) fail_agreed(failure);

  // Rank 0 commits the file; the others wait for the outcome, so that all end alike.
  hdf5.unlock();  // no HDF5 call from here on
  uint64_t bytes = 0;
  std::string commit_failure;
  if (rank == 0) {
    try {
      release_unused_reserve(tmp);
      // Test-only: die like a killed job after the data is written but before the rename.
      if (const int64_t t = env::test_die_before_rename(); t && t == m.step) std::_Exit(9);
      if (fault_requested("savecommit", m.step))
        throw_runtime(__FILE__, __LINE__,
                      cat("rename '", tmp, "': ", std::strerror(ENOSPC), " (RINGTRAIN_TEST_FAIL)"));
      commit_output(tmp, final_path);
      bytes = fs::file_size(final_path);
      if (after_commit) after_commit(final_path);
    } catch (const Error& e) {
      commit_failure = e.what();
      if (failed_for_space(tmp, commit_failure))  // the words every rank will recognise
        commit_failure = cat(commit_failure, " (ENOSPC)");
    }
  }
  commit_failure = failure_anywhere(comm, commit_failure);
  if (!commit_failure.empty()) fail_agreed(commit_failure);
  return bytes;
}

}  // namespace

uint64_t CheckpointStore::save(MPI_Comm comm, const CheckpointMeta& m,
                               const std::vector<NamedTensor>& params,
                               const std::vector<OptimizerState>& optimizer,
                               const std::vector<NamedTensor>& per_rank,
                               const std::vector<NamedTensor>& buffers) {
  return save_file(comm, path_for(m.step), cat("the checkpoints already in '", dir(), "' are kept"),
                   m, params, optimizer, per_rank, buffers, &direct_chunks_,
                   [this](const std::string& p) { prune(p); });
}

uint64_t save_checkpoint_file(MPI_Comm comm, const std::string& path, const CheckpointMeta& m,
                              const std::vector<NamedTensor>& params,
                              const std::vector<OptimizerState>& optimizer,
                              const std::vector<NamedTensor>& buffers) {
  int64_t direct = 0;
  return save_file(comm, path, cat("'", path, "' is untouched"), m, params, optimizer, {}, buffers,
                   &direct, {});
}

}  // namespace ringtrain::io
