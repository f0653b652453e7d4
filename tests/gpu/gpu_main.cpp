// main() of the single-process GPU suites. Without a usable CUDA device it says why and
// exits 77 before running anything: ctest's SKIP_RETURN_CODE shows that, and only that, as
// Skipped. With a device every test runs, and a failure is a failure (exit 1).
#include <cstdio>
#include <cstring>

#include "tests/gpu/gpu_util.hpp"
#include "tests/hermetic_env.hpp"

int main(int argc, char** argv) {
  ringtrain::test::clear_ringtrain_env();  // e.g. RINGTRAIN_CUDA_ATTENTION: tests set their own
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--source-dir=", 13) == 0) {
      ringtrain::test::source_dir() = argv[i] + 13;
    } else {
      std::fprintf(stderr, "gpu_tests: unknown argument '%s' (gtest flags, --source-dir=DIR)\n",
                   argv[i]);
      return 2;
    }
  const std::string& why = ringtrain::test::no_gpu_reason();
  if (!why.empty()) {
    std::printf("SKIPPED: no CUDA device (%s)\n", why.c_str());
    return ringtrain::test::kNoDeviceExit;
  }
  return RUN_ALL_TESTS();
}
