// Parallel checkpoints on 1, 2, 3 and 4 ranks: every rank writes its share of each dataset
// (sizes with fewer chunks than ranks, uneven chunk splits, several MiB) and its own row of
// a per-rank dataset; the file read back has exactly the values, validates, and a file
// written by W ranks holds the same datasets as one written by a single process.
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "io/checkpoint.hpp"
#include "io/hdf5.hpp"
#include "mpi_test_util.hpp"

namespace fs = std::filesystem;

namespace ringtrain {
namespace {

std::string shared_dir() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char path[256] = {0};
  if (rank == 0) {
    char tmpl[] = "/tmp/ringtrain-ckpt-XXXXXX";
    std::snprintf(path, sizeof path, "%s", mkdtemp(tmpl));
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

TEST(ParallelCheckpoint, EveryRankWritesItsShareAndTheFileReadsBackExactly) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string dir = shared_dir();
  // Replicated tensors: the same values on every rank.
  const std::vector<Shape> shapes = {{1}, {3}, {700, 513}, {1000, 1001}, {10, 256}};
  std::vector<std::vector<float>> values;
  std::vector<io::NamedTensor> params;
  for (size_t t = 0; t < shapes.size(); ++t) {
    values.emplace_back(static_cast<size_t>(shape_numel(shapes[t])));
    for (size_t i = 0; i < values[t].size(); ++i) values[t][i] = float(t * 1000003 + i) * 0.25f;
    params.push_back({"p" + std::to_string(t), Tensor(values[t].data(), shapes[t], DType::f32)});
  }
  std::vector<float> state(values[2].size(), 1.5f);
  std::vector<io::OptimizerState> opt = {
      {"momentum", {{"p2", Tensor(state.data(), shapes[2], DType::f32)}}}};
  uint64_t mine[4] = {uint64_t(rank) * 10 + 1, uint64_t(rank) * 10 + 2, uint64_t(rank) * 10 + 3,
                      uint64_t(rank) * 10 + 4};
  io::CheckpointMeta meta;
  meta.step = 7;
  meta.world_size = size;
  meta.model = "{}";
  meta.precision = "fp32";
  meta.ringtrain_version = "test";
  meta.optimizer = "sgd";
  io::CheckpointStore store(dir + "/par", 2);
  int failed = 0;
  try {
    store.save(MPI_COMM_WORLD, meta, params, opt, {{"rng/streams", Tensor(mine, {4}, DType::i64)}});
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
    failed = 1;
  }
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  ASSERT_EQ(failed, 0);
  MPI_Barrier(MPI_COMM_WORLD);  // rank 0 renamed the file into place
  // Every chunk was stored directly (pwritev with its Fletcher32) by exactly one rank: p0,
  // p1 and p4 one chunk each, p2 and its momentum 2 each (1.4 MB), p3 4 (4 MB), and one row
  // of rng/streams per rank.
  int64_t direct = store.last_direct_chunks();
  EXPECT_GT(direct, 0) << "rank " << rank << " wrote its rng/streams row through the filter";
  MPI_Allreduce(MPI_IN_PLACE, &direct, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(direct, 11 + size);

  const std::string file = store.path_for(7);
  std::string why;
  EXPECT_TRUE(io::validate_checkpoint(file, &why)) << why;
  std::vector<std::vector<float>> back;
  std::vector<io::NamedTensor> views;
  for (size_t t = 0; t < shapes.size(); ++t) {
    back.emplace_back(values[t].size(), -1.f);
    views.push_back({"p" + std::to_string(t), Tensor(back[t].data(), shapes[t], DType::f32)});
  }
  io::read_checkpoint_params(file, views);
  for (size_t t = 0; t < shapes.size(); ++t)
    for (size_t i = 0; i < values[t].size(); ++i)
      ASSERT_EQ(back[t][i], values[t][i]) << "p" << t << " at index " << i;
  std::vector<float> state_back(state.size());
  io::read_checkpoint_optimizer(
      file, {{"momentum", {{"p2", Tensor(state_back.data(), shapes[2], DType::f32)}}}});
  EXPECT_EQ(state_back, state);
  // The per-rank dataset: row r written by rank r.
  {
    io::H5Lock lock;
    io::H5Id f = io::open_file_readonly(file, "checkpoint");
    std::vector<int64_t> rows(static_cast<size_t>(4 * size));
    io::read_dataset(f, "rng/streams", Tensor(rows.data(), {size, 4}, DType::i64), file);
    for (int r = 0; r < size; ++r)
      for (int k = 0; k < 4; ++k) EXPECT_EQ(rows[size_t(r * 4 + k)], r * 10 + k + 1) << "row " << r;
  }
  // The same content as a file written by one process alone.
  if (rank == 0) {
    io::CheckpointStore serial(dir + "/serial", 2);
    serial.save(MPI_COMM_NULL, meta, params, opt);
    std::vector<std::vector<float>> again;
    std::vector<io::NamedTensor> v2;
    for (size_t t = 0; t < shapes.size(); ++t) {
      again.emplace_back(values[t].size());
      v2.push_back({"p" + std::to_string(t), Tensor(again[t].data(), shapes[t], DType::f32)});
    }
    io::read_checkpoint_params(serial.path_for(7), v2);
    EXPECT_EQ(again, back);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace ringtrain
