// main() of the single-process GPU suites: states once, up front, why the suite skips when
// there is no CUDA device (ctest's SKIP_REGULAR_EXPRESSION matches that line), then runs.
#include <cstdio>

#include "tests/gpu/gpu_util.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const std::string& why = ringtrain::test::no_gpu_reason();
  if (!why.empty()) std::printf("SKIPPED: no CUDA device (%s)\n", why.c_str());
  return RUN_ALL_TESTS();
}
