// Shared by the C++ micro-benchmarks (gemm_bench, conv_bench): timing of one call and the
// common command line (--batch N, --threads N, --json).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace ringtrain::bench {

// Seconds per call of f: `warmup` calls first, then at least `min_iters` calls and
// `min_secs` seconds.
template <typename F>
double time_per_call(F f, int warmup = 3, int min_iters = 5, double min_secs = 0.3) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < warmup; ++i) f();
  int iters = 0;
  const auto t0 = Clock::now();
  double secs = 0;
  while (iters < min_iters || secs < min_secs) {
    f();
    ++iters;
    secs = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return secs / iters;
}

struct Args {
  int batch = 64, threads = 1;
  bool json = false;
};

// Parses --batch N, --threads N and --json into `args` (its values are the defaults).
// Returns -1 to go on, else the exit code (0 for --help, 1 for anything else unknown).
inline int parse_args(int argc, char** argv, const char* name, Args& args) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batch" && i + 1 < argc)
      args.batch = std::stoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc)
      args.threads = std::stoi(argv[++i]);
    else if (a == "--json")
      args.json = true;
    else {
      std::fprintf(stderr, "usage: %s [--batch N] [--threads N] [--json]\n", name);
      return a == "--help" ? 0 : 1;
    }
  }
  return -1;
}

}  // namespace ringtrain::bench
