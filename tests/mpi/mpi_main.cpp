// main() of the multi-rank GoogleTest suite, run by CTest under mpiexec -n 1, 2, 3 and 4
// (each rank count with the tests that mean something there, tests/mpi/CMakeLists.txt).
// Rank 0 prints the usual GoogleTest output; every other rank prints only its failures,
// prefixed with its rank. At the end the ranks agree on the outcome with an allreduce, so
// each exits non-zero when any rank failed. A skipped test counts as failed: CTest would
// report it as passed, and a test that cannot run at a rank count is not registered there.
// The caller's RINGTRAIN_* variables are cleared first (tests/hermetic_env.hpp).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "../hermetic_env.hpp"
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
  ringtrain::test::clear_ringtrain_env();
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
  const int skipped = testing::UnitTest::GetInstance()->skipped_test_count();
  if (skipped > 0) {
    std::fprintf(stderr, "[rank %d] %d test(s) skipped on %d rank(s): a skip is a failure here\n",
                 rank, skipped, size);
    failed = 1;
  }
  if (testing::UnitTest::GetInstance()->test_to_run_count() == 0) {
    std::fprintf(stderr, "[rank %d] no test selected on %d rank(s)\n", rank, size);
    failed = 1;
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("mpi suite on %d rank(s): %s\n", size,
                any ? "FAILED on some rank" : "passed on every rank");
  MPI_Finalize();
  return any;
}
