// main() of the unit tests: GoogleTest's, after clearing the caller's RINGTRAIN_* variables
// (tests/hermetic_env.hpp), so that the results do not depend on the environment.
#include <gtest/gtest.h>

#include "../hermetic_env.hpp"

int main(int argc, char** argv) {
  ringtrain::test::clear_ringtrain_env();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
