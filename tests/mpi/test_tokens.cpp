// Token windows read from real files by W ranks at once (registered at 2, 3 and 4 ranks):
// the windows the ranks read for each global batch, gathered in rank order, are the ones
// one loader reads for the whole batch, across an epoch boundary and after a seek to a
// checkpointed position; every rank reads its slice from the shared HDF5 files itself.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "io/loader.hpp"
#include "io/tokens.hpp"

namespace ringtrain {
namespace {

// Rank 0 writes 3 shards of a token stream (token i = (i * 37 + i / 251) % 256) in a temp
// dir; every rank gets the glob of them.
std::string shared_token_shards() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char spec[256] = {0};
  if (rank == 0) {
    char dir[] = "/tmp/ringtrain-mpi-tok-XXXXXX";
    const std::string d = mkdtemp(dir);
    std::vector<uint32_t> t(5000);
    for (size_t i = 0; i < t.size(); ++i) t[i] = uint32_t((i * 37 + i / 251) % 256);
    for (int s = 0; s < 3; ++s) {
      const size_t lo = t.size() * size_t(s) / 3, hi = t.size() * size_t(s + 1) / 3;
      io::write_token_file(d + "/tok-0000" + std::to_string(s) + "-of-00003.h5", t.data() + lo,
                           int64_t(hi - lo), {0}, 256, "bytes", "train");
    }
    std::snprintf(spec, sizeof spec, "%s/tok-*-of-00003.h5", d.c_str());
  }
  MPI_Bcast(spec, sizeof spec, MPI_CHAR, 0, MPI_COMM_WORLD);
  return spec;
}

TEST(TokenWindowsAcrossRanks, RankSlicesGatherToTheOneRankBatch) {
  const std::string spec = shared_token_shards();
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ASSERT_GE(world, 2) << "registered at 1 rank, where there is nothing to compare";
  io::TokenDataset data(spec);
  const int64_t g = 48, t = 16;
  // Shards of 1666-1667 tokens: 3 x 104 = 312 windows, 6 batches of 48 an epoch.
  data.set_seq_len(t);
  io::TokenDataset whole(spec);  // the one-rank reference, read by every rank for itself
  whole.set_seq_len(t);
  for (int64_t resume_at : {int64_t(0), int64_t(9)}) {
    io::Loader mine(data, 5, g, rank, world, /*prefetch=*/2);
    io::Loader one(whole, 5, g, 0, 1);
    if (resume_at > 0) {  // the position a checkpoint after step 9 records
      io::Loader probe(whole, 5, g, 0, 1);
      for (int64_t s = 0; s < resume_at; ++s) probe.next();
      mine.seek(probe.epoch(), probe.position());
      one.seek(probe.epoch(), probe.position());
    }
    int bad = 0;
    for (int64_t s = resume_at; s < 12; ++s) {
      const io::Batch& b = mine.next();
      std::vector<int32_t> all(size_t(g * t)), tall(size_t(g * t));
      MPI_Allgather(b.x.as<int32_t>(), int(g / world * t), MPI_INT, all.data(), int(g / world * t),
                    MPI_INT, MPI_COMM_WORLD);
      MPI_Allgather(b.y.as<int32_t>(), int(g / world * t), MPI_INT, tall.data(), int(g / world * t),
                    MPI_INT, MPI_COMM_WORLD);
      const io::Batch& r = one.next();
      const std::vector<int32_t> want(r.x.as<int32_t>(), r.x.as<int32_t>() + g * t);
      const std::vector<int32_t> want_y(r.y.as<int32_t>(), r.y.as<int32_t>() + g * t);
      bad += all != want || tall != want_y;
      EXPECT_EQ(all, want) << "inputs of step " << s << " (resumed at " << resume_at << ")";
      EXPECT_EQ(tall, want_y) << "targets of step " << s;
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(bad, 0) << "some rank saw other windows";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0)
    std::filesystem::remove_all(std::filesystem::path(data.shard(0).path()).parent_path());
}

}  // namespace
}  // namespace ringtrain
