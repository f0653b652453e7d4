// Writing datasets (format v1, docs/formats.md) and predictions from every rank at once:
// a collective parallel-HDF5 writer where each rank writes its own rows (a hyperslab), the
// dataset writer of `convert npy|images|cifar` (shards, per-channel mean/std, class names,
// optional labels; .tmp names renamed only when every file is complete), and the reader
// of string lists (class names) written by it or by h5py.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "io/hdf5.hpp"

namespace ringtrain::io {

// Parallel HDF5 (MPI-IO, collective metadata and transfers) over `comm`; every rank makes
// the same calls with the same names and shapes, each passing its own rows.
class ParallelH5Writer {
 public:
  explicit ParallelH5Writer(MPI_Comm comm);
  // Creates (truncates) `path` after rank 0 reserved `reserve_bytes` for it (an upper bound
  // of the file, e.g. h5_file_bytes_bound of the extents below): HDF5's collective flush
  // cannot agree across ranks on a failed write, so the writes must not run out of space.
  // A file system without that room is the full-disk error on every rank, before HDF5
  // writes anything.
  H5Id create(const std::string& path, uint64_t reserve_bytes) const;
  // The extent of a dataset write_rows creates (its chunking), for the reservation.
  static ChunkedExtent extent(const Shape& shape, DType dtype, int64_t chunk_rows = 0);
  // A dataset of global `shape` (rows along dim 0), chunked by `chunk_rows` rows (0: about
  // 1 MiB), with Fletcher32 when `checksum`; this rank writes rows [lo, lo + count) from
  // `data` (count rows, contiguous).
  void write_rows(hid_t loc, const std::string& name, DType dtype, const Shape& shape, int64_t lo,
                  int64_t count, const void* data, bool checksum, int64_t chunk_rows = 0) const;
  // A 1-d dataset of fixed-length UTF-8 strings (the same list on every rank).
  void write_strings(hid_t loc, const std::string& name, const std::vector<std::string>& v) const;
  // Flushes and closes the file (collective), checked: what HDF5 still caches is written
  // here, so a full disk shows here.
  static void close(H5Id& file, const std::string& path);

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  H5Id dxpl_;
};

// Strings of a 1-d dataset, fixed- or variable-length (what h5py writes for a list of str).
std::vector<std::string> read_strings(hid_t loc, const std::string& name, const std::string& what);
// /class_names of a dataset file, or empty when it has none.
std::vector<std::string> read_class_names(const std::string& dataset_file);

// Adds, per channel c, the sum and sum of squares of the values of n samples [C, ...] to
// sum[c] and sq[c]. uint8 values are added unscaled: the sums are integers, exact in a
// double up to 2^53, so they do not depend on how the samples are split over ranks (scale
// by 1/255 and 1/255^2 afterwards).
void add_channel_stats(const uint8_t* images, int64_t n, const Shape& sample, DType dtype,
                       double* sum, double* sq);

struct DatasetHeader {
  int64_t num_samples = 0;
  Shape sample_shape;
  DType dtype = DType::u8;
  bool has_labels = true;
  int64_t num_classes = 0;  // attribute written only when > 0
  std::vector<std::string> class_names;
  std::vector<double> mean, std;  // per channel ([C]; one value for [D] samples)
  double mean_all = 0, std_all = 1;
  Shape target_shape;  // /targets per sample; empty: none
  DType target_dtype = DType::f32;
};

// The names `out` becomes with `shards` files: out itself, or OUT-0000k-of-0000N.h5.
std::vector<std::string> shard_names(const std::string& out, int shards);

// Collective over comm: writes the dataset files (shard k holds the samples
// [k*N/S, (k+1)*N/S)) from this rank's samples [lo, lo + count) (images as stored, labels
// when h.has_labels). Each file is written as NAME.tmp; rank 0 renames all when all are
// complete. On an error, this rank removes the .tmp files before rethrowing (the full-disk
// message when the file system is full).
std::vector<std::string> write_dataset_parallel(MPI_Comm comm, const std::string& out, int shards,
                                                const DatasetHeader& h, int64_t lo, int64_t count,
                                                const uint8_t* images, const int64_t* labels,
                                                const void* targets = nullptr);

}  // namespace ringtrain::io
