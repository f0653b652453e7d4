// Helpers of the multi-rank tests: a synthetic dataset file shared by all ranks, and
// comparisons of a buffer across ranks.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "io/dataset.hpp"

namespace ringtrain::test {

// Rank 0 writes a learnable dataset (class = which quarter of the image is brightest) of
// n samples [1, 8, 8] with 4 classes into a temp dir; every rank gets its path.
inline std::string shared_dataset(int64_t n, uint64_t seed) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char path[256] = {0};
  if (rank == 0) {
    char dir[] = "/tmp/ringtrain-mpi-XXXXXX";
    std::string d = mkdtemp(dir);
    std::snprintf(path, sizeof path, "%s/data.h5", d.c_str());
    Rng rng(seed);
    std::vector<uint8_t> img(static_cast<size_t>(n * 64));
    std::vector<int32_t> labels(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const int c = int(rng.below(4));
      labels[size_t(i)] = c;
      for (int y = 0; y < 8; ++y)
        for (int x = 0; x < 8; ++x) {
          const int q = (y / 4) * 2 + x / 4;
          img[size_t(i * 64 + y * 8 + x)] = uint8_t(rng.below(120) + (q == c ? 120 : 0));
        }
    }
    io::write_dataset_files(path, img.data(), {n, 1, 8, 8}, labels.data(), 4);
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

// True on every rank when `bytes` of `data` are identical on all ranks.
inline bool identical_on_all_ranks(const void* data, size_t bytes) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<char> all(bytes * size_t(size));
  MPI_Allgather(data, int(bytes), MPI_BYTE, all.data(), int(bytes), MPI_BYTE, MPI_COMM_WORLD);
  int same = 1;
  for (int r = 1; r < size; ++r)
    same &= std::memcmp(all.data(), all.data() + bytes * size_t(r), bytes) == 0;
  return same != 0;
}

}  // namespace ringtrain::test
