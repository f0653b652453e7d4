// For the test mains (tests/unit, tests/mpi): clears every RINGTRAIN_* variable of the
// caller's environment before any test runs, so that e.g. an exported RINGTRAIN_CONV,
// RINGTRAIN_RANKS_PER_NODE or RINGTRAIN_TEST_DIE_BEFORE_RENAME cannot change or break what
// the tests compute; a test that needs one sets it itself. (OpenMP reads OMP_* when the
// program loads, before main: those are set by CTest's ENVIRONMENT where a test needs them.)
#pragma once

#include <unistd.h>  // environ

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace ringtrain::test {

inline void clear_ringtrain_env() {
  std::vector<std::string> names;  // collected first: unsetenv changes environ
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "RINGTRAIN_", 10) == 0) {
      const char* eq = std::strchr(*e, '=');
      names.emplace_back(*e, eq ? size_t(eq - *e) : std::strlen(*e));
    }
  for (const auto& n : names) unsetenv(n.c_str());
}

}  // namespace ringtrain::test
