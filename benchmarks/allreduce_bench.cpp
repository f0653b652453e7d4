// allreduce_bench, in the style of nccl-tests: a sweep of gradient sizes, warm-up and timed
// iterations, one row per size and path: size count type backend time_us algbw busbw
// #wrong (busbw = algbw * 2(n-1)/n; results checked after timing, wrong elements summed
// over ranks). Paths: the reference raw MPI_Allreduce(MPI_FLOAT, MPI_SUM), and ringtrain's
// flat (mpi) and hierarchical communicators in fp32, fp16 and bf16. "size" is the fp32
// gradient's bytes; every path moves the same number of elements, so time ratios against
// the reference are what switching the wire dtype buys.
//   usage: mpirun -n N allreduce_bench [-b 8] [-e 256M] [-f 2] [-w 5] [-n 20] [--json]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/hierarchical.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "core/dtype.hpp"

using namespace ringtrain;
using Clock = std::chrono::steady_clock;

namespace {

int64_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
  return int64_t(v);
}

float value(int rank, int64_t i) { return float((i % 7) + 1) * float(rank + 1); }  // exact sums

struct Result {
  double time_us;
  int64_t wrong;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int64_t minb = 8, maxb = int64_t(256) << 20, factor = 2, warm = 5, iters = 20;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : "0"; };
    if (a == "-b")
      minb = parse_size(next());
    else if (a == "-e")
      maxb = parse_size(next());
    else if (a == "-f")
      factor = std::max<int64_t>(2, parse_size(next()));
    else if (a == "-w")
      warm = parse_size(next());
    else if (a == "-n")
      iters = std::max<int64_t>(1, parse_size(next()));
    else if (a == "--json")
      json = true;
    else {
      if (rank == 0)
        std::fprintf(stderr,
                     "usage: allreduce_bench [-b 8] [-e 256M] [-f 2] [-w 5] [-n 20] [--json]\n");
      MPI_Finalize();
      return a == "--help" ? 0 : 1;
    }
  }
  comm::MpiCommunicator flat(MPI_COMM_WORLD);
  std::unique_ptr<comm::HierarchicalCommunicator> hier;
  try {
    hier = std::make_unique<comm::HierarchicalCommunicator>(MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "# hierarchical skipped: %s\n", e.what());
  }
  const double bus = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  if (rank == 0 && !json) {
    std::printf("# allreduce_bench: %d ranks on %d node(s), %s\n", n, flat.num_nodes(),
                comm::mpi_library_version().c_str());
    std::printf("%12s %11s %6s %13s %11s %9s %9s %7s %8s\n", "size", "count", "type", "backend",
                "time_us", "algbw", "busbw", "#wrong", "vs_raw");
  }
  if (rank == 0 && json) std::printf("[");
  bool first_row = true;
  for (int64_t size = minb; size <= maxb; size *= factor) {
    const int64_t count = std::max<int64_t>(1, size / 4);
    const int64_t it = std::max<int64_t>(3, std::min<int64_t>(iters, (int64_t(1) << 30) / size));
    std::vector<float> src(static_cast<size_t>(count)), dst(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) src[size_t(i)] = value(rank, i);
    const float tri = float(n * (n + 1) / 2);
    double raw_us = 0;
    auto row = [&](const char* type, const char* backend, int64_t bytes, const Result& r) {
      if (rank != 0) return;
      const double algbw = double(bytes) / (r.time_us * 1e-6) / 1e9;
      const double vs = raw_us > 0 ? raw_us / r.time_us : 1.0;
      if (json) {
        std::printf(
            "%s{\"size\":%lld,\"count\":%lld,\"type\":\"%s\",\"backend\":\"%s\",\"time_us\":%.2f,"
            "\"algbw\":%.3f,\"busbw\":%.3f,\"wrong\":%lld,\"vs_raw\":%.3f,\"ranks\":%d,"
            "\"nodes\":%d}",
            first_row ? "" : ",", static_cast<long long>(size), static_cast<long long>(count), type,
            backend, r.time_us, algbw, algbw * bus, static_cast<long long>(r.wrong), vs, n,
            flat.num_nodes());
        first_row = false;
      } else {
        std::printf("%12lld %11lld %6s %13s %11.1f %9.3f %9.3f %7lld %8.3f\n",
                    static_cast<long long>(size), static_cast<long long>(count), type, backend,
                    r.time_us, algbw, algbw * bus, static_cast<long long>(r.wrong), vs);
      }
    };
    // Times `it` calls of op after `warm` untimed ones; reset() restores the input before
    // every call (outside the timing); wrong() counts bad elements of the last result.
    auto measure = [&](auto reset, auto op, auto wrong) {
      double secs = 0;
      for (int64_t k = 0; k < warm + it; ++k) {
        reset();
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = Clock::now();
        op();
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (k >= warm) secs += s;
      }
      double slowest = secs;  // the collective takes as long as its slowest rank
      MPI_Allreduce(MPI_IN_PLACE, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      int64_t bad = wrong();
      MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
      return Result{slowest / double(it) * 1e6, bad};
    };
    // The reference: raw MPI on fp32, out of place.
    const Result raw = measure([] {},
                               [&] {
                                 MPI_Allreduce(src.data(), dst.data(), int(count), MPI_FLOAT,
                                               MPI_SUM, MPI_COMM_WORLD);
                               },
                               [&] {
                                 int64_t bad = 0;
                                 for (int64_t i = 0; i < count; ++i)
                                   bad += dst[size_t(i)] != float((i % 7) + 1) * tri;
                                 return bad;
                               });
    raw_us = raw.time_us;
    row("float", "raw-MPI", count * 4, raw);
    std::vector<uint16_t> src16(static_cast<size_t>(count)), buf16(static_cast<size_t>(count));
    for (comm::Communicator* c :
         {static_cast<comm::Communicator*>(&flat), static_cast<comm::Communicator*>(hier.get())}) {
      if (!c) continue;
      for (DType t : {DType::f32, DType::f16, DType::bf16}) {
        void* buf = t == DType::f32 ? static_cast<void*>(dst.data()) : buf16.data();
        if (t != DType::f32)
          for (int64_t i = 0; i < count; ++i)
            src16[size_t(i)] =
                t == DType::f16 ? float_to_half(src[size_t(i)]) : float_to_bf16(src[size_t(i)]);
        const Result r = measure(
            [&] {
              if (t == DType::f32)
                std::memcpy(dst.data(), src.data(), size_t(count) * 4);
              else
                std::memcpy(buf16.data(), src16.data(), size_t(count) * 2);
            },
            [&] { c->allreduce(buf, count, t, comm::ReduceOp::sum); },
            [&] {
              int64_t bad = 0;
              for (int64_t i = 0; i < count; ++i) {
                const float got = t == DType::f32   ? dst[size_t(i)]
                                  : t == DType::f16 ? half_to_float(buf16[size_t(i)])
                                                    : bf16_to_float(buf16[size_t(i)]);
                bad += got != float((i % 7) + 1) * tri;
              }
              return bad;
            });
        row(dtype_name(t), c == &flat ? "ringtrain-mpi" : "ringtrain-hier",
            count * int64_t(dtype_size(t)), r);
      }
    }
  }
  if (rank == 0 && json) std::printf("]\n");
  MPI_Finalize();
  return 0;
}
