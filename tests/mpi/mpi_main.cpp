// main() of the multi-rank GoogleTest suite, run by CTest under mpiexec -n 1, 2, 3 and 4.
// Rank 0 prints the usual GoogleTest output; every other rank prints only its failures,
// prefixed with its rank. At the end the ranks agree on the outcome with an allreduce, so
// each exits non-zero when any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "io/hdf5.hpp"

namespace {

class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                   r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ringtrain::io::silence_hdf5_errors();
  testing::InitGoogleTest(&argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto& listeners = testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0;
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("mpi suite on %d rank(s): %s\n", size,
                any ? "FAILED on some rank" : "passed on every rank");
  MPI_Finalize();
  return any;
}
