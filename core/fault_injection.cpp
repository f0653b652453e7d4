// RINGTRAIN_TEST_FAIL and RINGTRAIN_TEST_STALL parsing and the injection check (see
// fault_injection.hpp); the table (core/env_table.inc) has checked their form.
#include "core/fault_injection.hpp"
#include "core/env.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.hpp"

namespace ringtrain {
namespace {

struct Fault {
  int rank = -1;
  char point[32] = {0};
  long long step = -1;
  bool valid = false;
};

std::atomic<int> g_rank{-1};

const Fault& fault() {
  static const Fault f = [] {
    Fault f;
    const std::string v = env::test_fail();
    if (v.empty()) return f;
    const int n = std::sscanf(v.c_str(), "%d:%31[a-z]:%lld", &f.rank, f.point, &f.step);
    RT_REQUIRE(n >= 2, "RINGTRAIN_TEST_FAIL='", v, "' is not valid; expected RANK:POINT[:STEP]");
    f.valid = true;
    return f;
  }();
  return f;
}

}  // namespace

void set_fault_rank(int rank) {
  g_rank.store(rank);
  fault();  // a malformed variable is reported at start-up
}

bool fault_requested(const char* point, int64_t step) {
  const Fault& f = fault();
  if (!f.valid || f.rank != g_rank.load() || std::strcmp(f.point, point) != 0) return false;
  return f.step < 0 || step < 0 || f.step == step;
}

void maybe_inject_fault(const char* point, int64_t step) {
  if (!fault_requested(point, step)) return;
  const Fault& f = fault();
  throw Error(ErrorKind::runtime,
              cat("injected test failure at '", point, "' on rank ", f.rank,
                  step >= 0 ? cat(" in step ", step) : std::string(), " (RINGTRAIN_TEST_FAIL)"));
}

StallHook stall_hook() {
  StallHook h;
  const std::string v = env::test_stall();
  if (v.empty()) return h;
  long long step = 0;
  char point[16] = {0};
  const int got = std::sscanf(v.c_str(), "%d:%lld:%lf:%15s", &h.rank, &step, &h.seconds, point);
  RT_REQUIRE(
      got == 3 || (got == 4 && (std::string(point) == "gather" || std::string(point) == "reduce")),
      "RINGTRAIN_TEST_STALL='", v, "' is not valid; expected RANK:STEP:SECONDS[:gather|:reduce]");
  h.step = step;
  h.gather = got == 4 && std::string(point) == "gather";
  h.reduce = got == 4 && std::string(point) == "reduce";
  return h;
}

SlowHook slow_forward_hook() {
  SlowHook h;
  const std::string v = env::test_slow_forward();
  if (v.empty()) return h;
  long long ms = 0;
  RT_REQUIRE(std::sscanf(v.c_str(), "%d:%lld", &h.rank, &ms) == 2, "RINGTRAIN_TEST_SLOW_FORWARD='",
             v, "' is not valid; expected RANK:MS");
  h.seconds = double(ms) * 1e-3;
  return h;
}

}  // namespace ringtrain
