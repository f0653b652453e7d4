// A thin RAII layer over the HDF5 C API for ringtrain's files: owned ids, H5_CHECK, and
// helpers for the attributes and datasets the dataset and checkpoint formats use.
// Errors: a file that is missing or not HDF5 is an input error naming the file; a failed
// HDF5 call is a runtime error with HDF5's own message stack.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/tensor.hpp"

namespace ringtrain::io {

// The outermost messages of HDF5's current error stack, and "(ENOSPC)" when an inner one
// says the device is full (so that a caller can tell a full file system from other errors).
std::string h5_error_stack();

// Debian's parallel HDF5 is not built thread-safe: every io entry point that calls HDF5
// holds this (recursive) lock, so the loader's prefetch thread and the main thread's
// checkpoints never run HDF5 code at the same time.
std::recursive_mutex& hdf5_mutex();
struct H5Lock {
  std::lock_guard<std::recursive_mutex> guard{hdf5_mutex()};
};
// Lets go of the lock this thread holds (through one H5Lock) for a stretch without HDF5 calls:
// a collective wait or plain writes of a checkpoint save, so that the loader's thread can read
// meanwhile while a save runs in the background (--async-checkpoint). Taken again at the end.
struct H5Unlock {
  H5Unlock() { hdf5_mutex().unlock(); }
  ~H5Unlock() { hdf5_mutex().lock(); }
  H5Unlock(const H5Unlock&) = delete;
  H5Unlock& operator=(const H5Unlock&) = delete;
};

#define H5_CHECK(stmt)                                                             \
  ([&] {                                                                           \
    auto rt_h5_rc_ = (stmt);                                                       \
    if (rt_h5_rc_ < 0)                                                             \
      ::ringtrain::throw_runtime(                                                  \
          __FILE__, __LINE__,                                                      \
          ::ringtrain::cat(#stmt " failed: ", ::ringtrain::io::h5_error_stack())); \
    return rt_h5_rc_;                                                              \
  }())

// Marks the calling thread as working on a file opened with MPI-IO (the checkpoint writer),
// whose handles must not be closed by one rank alone (see H5Id).
class CollectiveFileScope {
 public:
  CollectiveFileScope() { ++depth(); }
  ~CollectiveFileScope() { --depth(); }
  CollectiveFileScope(const CollectiveFileScope&) = delete;
  CollectiveFileScope& operator=(const CollectiveFileScope&) = delete;
  static bool active() { return depth() > 0; }

 private:
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
};

// An owned hid_t, closed with the function that matches its type.
class H5Id {
 public:
  H5Id() = default;
  explicit H5Id(hid_t id) : id_(id) {}
  H5Id(H5Id&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  // While an exception unwinds inside a CollectiveFileScope, the handle is left open rather
  // than closed: closing is collective, and the other ranks are not closing it; the job
  // then ends through launch::fail_job (MPI_Abort), which closes nothing.
  ~H5Id() {
    if (!(CollectiveFileScope::active() && std::uncaught_exceptions() > 0)) reset();
  }
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  // Closes without looking at the result (destructors, cleanup after an error).
  void reset();
  // Closes and returns HDF5's result: closing a file or dataset writes what HDF5 still caches
  // of it, so a writer checks it (the id is released either way).
  herr_t close_status();
  // Closes; a failure throws a runtime error naming `what` with HDF5's message stack.
  void close(const std::string& what);

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Opens an existing HDF5 file read-only. `role` ("dataset", "checkpoint") goes into the
// message when the file is missing, unreadable or not HDF5 (input errors).
H5Id open_file_readonly(const std::string& path, const char* role);
H5Id create_file(const std::string& path);  // truncates
// Makes HDF5 quiet (ringtrain reports errors itself); call once per process.
void silence_hdf5_errors();

bool has_attr(hid_t obj, const char* name);
void write_attr(hid_t obj, const char* name, const std::string& value);
void write_attr(hid_t obj, const char* name, int64_t value);
void write_attr(hid_t obj, const char* name, double value);
std::optional<std::string> read_attr_string(hid_t obj, const char* name);
std::optional<int64_t> read_attr_int(hid_t obj, const char* name);
std::optional<double> read_attr_double(hid_t obj, const char* name);
// A 1-D float64 attribute (per-channel values); nullopt when absent or not numeric.
void write_attr(hid_t obj, const char* name, const std::vector<double>& values);
std::optional<std::vector<double>> read_attr_doubles(hid_t obj, const char* name);
// A whole 1-D numeric dataset read as float64 (HDF5 converts); nullopt when absent.
std::optional<std::vector<double>> read_doubles(hid_t loc, const char* name);

bool has_link(hid_t loc, const std::string& path);  // path may have several components
H5Id create_group(hid_t loc, const std::string& name);
// Opens a dataset; input error naming the file when `name` is a group or another object
// that is not a dataset (a missing one is still HDF5's runtime error: check has_link first).
H5Id open_dataset(hid_t loc, const std::string& name, hid_t dapl = H5P_DEFAULT);
void require_dataset_object(hid_t loc, const std::string& name);
Shape dataset_shape(hid_t ds);
// The ringtrain DType of a dataset's element type, if it is one of ours.
std::optional<DType> dataset_dtype(hid_t ds);
hid_t h5_type(DType t);  // native HDF5 type of a DType

// Writes a whole tensor as a new dataset, chunked along the first dimension with
// Fletcher32 checksums (chunk_rows 0: about 1 MiB per chunk).
void write_dataset(hid_t loc, const std::string& name, const Tensor& t, int64_t chunk_rows = 0);
// Reads a whole dataset into dst, whose shape and dtype it must have (else input error
// naming `what`, e.g. the file).
void read_dataset(hid_t loc, const std::string& name, const Tensor& dst, const std::string& what);
// Selects in `space` (a dataspace of row-major `shape`) the flat elements [lo, lo + n), as a
// union of at most 2 x rank - 1 hyperslabs: a rank's part of a sharded tensor.
void select_flat_range(hid_t space, const Shape& shape, int64_t lo, int64_t n);
// Selects the [begin, end) ranges (increasing, disjoint) along `axis` of a dataset of
// `shape`, all of every other axis: in row-major order, the elements of the tensor that
// concatenates those ranges along the axis (a tensor-parallel part). No ranges: nothing.
void select_axis_ranges(hid_t space, const Shape& shape, int axis,
                        const std::vector<std::pair<int64_t, int64_t>>& ranges);
// Reads that selection of dataset `name` (of `shape`) into dst (its numel elements).
void read_dataset_ranges(hid_t loc, const std::string& name, const Shape& shape, int axis,
                         const std::vector<std::pair<int64_t, int64_t>>& ranges, const Tensor& dst,
                         const std::string& what);
// Reads the flat elements [lo, lo + dst.numel()) of dataset `name` of shape `shape` into dst
// (input error naming `what` when the dataset is missing, misshapen or unreadable).
void read_dataset_part(hid_t loc, const std::string& name, const Shape& shape, int64_t lo,
                       const Tensor& dst, const std::string& what);

// For reserving an HDF5 file's space before it is written (io/output_file.hpp): an upper
// bound of the bytes of a file of chunked datasets, each holding `bytes` in chunks of
// `chunk_bytes` as stored (HDF5 allocates every chunk whole, an edge chunk too), chunks of
// 64 KiB or more aligned to `block` (what the parallel writers ask with H5Pset_alignment),
// plus `attr_bytes` of attribute values; generous room for HDF5's own metadata.
// The block size of the file system holding `path` (its directory; 4096 when unknown): the
// parallel writers align chunks of 64 KiB or more to it, so that no two ranks share a block.
uint64_t fs_block_size(const std::string& path);
struct ChunkedExtent {
  uint64_t bytes = 0, chunk_bytes = 0;
};
uint64_t h5_file_bytes_bound(const std::vector<ChunkedExtent>& datasets, uint64_t block,
                             uint64_t attr_bytes);

// Flushes a closed file's data to stable storage (open + fsync + close); also fsyncs the
// directory that holds it when `dir` is true.
void fsync_path(const std::string& path, bool dir = false);

}  // namespace ringtrain::io
