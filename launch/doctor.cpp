// `ringtrain doctor` (see doctor.hpp). The link tests are point-to-point MPI on the world
// communicator, polled against a deadline: a rank that is stuck or cut off ends the job
// with a message naming it and its host, instead of hanging the check meant to find it.
#include "launch/doctor.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "core/tensor.hpp"
#include "kernels/kernels.hpp"
#include "launch/option_parsing.hpp"
#include "train/device.hpp"
#include "train/job.hpp"

namespace ringtrain::launch {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr int kTagData = 7701, kTagDone = 7702;

struct Context {
  MPI_Comm comm;
  double timeout;
  std::vector<std::string> hosts;
};

// Waits for `n` requests, polling; past the deadline the job ends naming `partner` (or the
// ranks in general for a collective, partner < 0). A link test polls at once (its latency
// is measured); every other wait sleeps between polls, so that the ranks waiting for a
// link test to end leave the cores to the ranks measuring it.
enum class Poll { busy, patient };
void pause(Poll poll) {
  if (poll == Poll::busy)
    sched_yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(500));
}

void wait_for(const Context& ctx, MPI_Request* reqs, int n, int partner, const char* what,
              MPI_Status* status = nullptr, Poll poll = Poll::patient) {
  const auto start = Clock::now();
  for (;;) {
    int done = 0;
    if (n == 1 && status)
      MPI_Test(reqs, &done, status);
    else
      MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    if (done) return;
    if (since(start) > ctx.timeout) {
      const std::string who = partner >= 0
                                  ? cat("rank ", partner, " on ", ctx.hosts.at(size_t(partner)))
                                  : std::string("every rank");
      throw Error(ErrorKind::runtime,
                  cat("ringtrain doctor: no answer from ", who, " within ", ctx.timeout, " s (",
                      what, "): that rank is stuck or the link to it is down"));
    }
    pause(poll);
  }
}

// A barrier through rank 0 that knows who is missing: rank 0 names the ranks that did not
// arrive within the timeout; the others wait a little longer for its release, so that the
// message that ends the job is rank 0's.
constexpr int kTagSync = 7703;
void barrier(const Context& ctx, int rank, int w, const char* what) {
  char token = 0;
  if (rank != 0) {
    MPI_Request r[2];
    MPI_Isend(&token, 1, MPI_BYTE, 0, kTagSync, ctx.comm, &r[0]);
    MPI_Irecv(&token, 1, MPI_BYTE, 0, kTagSync, ctx.comm, &r[1]);
    Context later = ctx;
    later.timeout = ctx.timeout + 3;
    wait_for(later, r, 2, 0, what);
    return;
  }
  std::vector<MPI_Request> r(size_t(w - 1));
  std::vector<char> tokens(size_t(w), 0);
  for (int p = 1; p < w; ++p)
    MPI_Irecv(&tokens[size_t(p)], 1, MPI_BYTE, p, kTagSync, ctx.comm, &r[size_t(p - 1)]);
  const auto start = Clock::now();
  for (;;) {
    int done = 0;
    MPI_Testall(w - 1, r.data(), &done, MPI_STATUSES_IGNORE);
    if (done) break;
    if (since(start) > ctx.timeout) {
      std::string missing;
      for (int p = 1; p < w; ++p) {
        int arrived = 0;
        MPI_Test(&r[size_t(p - 1)], &arrived, MPI_STATUS_IGNORE);
        if (!arrived) missing += cat(missing.empty() ? "" : ", ", p, " on ", ctx.hosts[size_t(p)]);
      }
      throw Error(ErrorKind::runtime,
                  cat("ringtrain doctor: no answer from rank ", missing, " within ", ctx.timeout,
                      " s (", what, "): stuck, or its link is down"));
    }
    pause(Poll::patient);
  }
  for (int p = 1; p < w; ++p)
    MPI_Isend(&token, 1, MPI_BYTE, p, kTagSync, ctx.comm, &r[size_t(p - 1)]);
  wait_for(ctx, r.data(), w - 1, -1, what);
}

// Best fp32 GEMM rate (GFLOP/s) over rounds of about seconds/3 each.
double gemm_rate(kernels::Backend& backend, int64_t n, double seconds) {
  OwnedTensor a, b, c;
  const Device cpu{};
  a.ensure({n, n}, DType::f32, cpu);
  b.ensure({n, n}, DType::f32, cpu);
  c.ensure({n, n}, DType::f32, cpu);
  for (int64_t i = 0; i < n * n; ++i) {
    a.view.as<float>()[i] = float(i % 7) * 0.25f - 0.75f;
    b.view.as<float>()[i] = float(i % 5) * 0.125f - 0.25f;
  }
  backend.gemm(false, false, 1.f, a.view, b.view, 0.f, c.view);  // warm-up: packing, JIT
  const double flops = 2.0 * double(n) * double(n) * double(n);
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    const auto t = Clock::now();
    int64_t k = 0;
    do {
      backend.gemm(false, false, 1.f, a.view, b.view, 0.f, c.view);
      ++k;
    } while (since(t) < seconds / 3);
    best = std::max(best, flops * double(k) / since(t) / 1e9);
  }
  return best;
}

// Best STREAM-triad bandwidth (GB/s: two arrays read, one written) over rounds.
double triad_rate(int64_t mib, int threads, double seconds) {
  const int64_t n = mib * (int64_t(1) << 20) / int64_t(sizeof(float));
  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n)),
      z(static_cast<size_t>(n));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) {  // first touch by the threads that use the pages
    x[size_t(i)] = 1.f;
    y[size_t(i)] = 2.f;
    z[size_t(i)] = 0.f;
  }
  float* px = x.data();
  const float* py = y.data();
  const float* pz = z.data();
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    const auto t = Clock::now();
    int64_t k = 0;
    do {
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int64_t i = 0; i < n; ++i) px[i] = py[i] + 0.5f * pz[i];
      ++k;
    } while (since(t) < seconds / 3);
    best = std::max(best, 3.0 * double(n) * sizeof(float) * double(k) / since(t) / 1e9);
  }
  volatile float sink = x[size_t(n / 2)];  // the stores are used
  (void)sink;
  return best;
}

struct Link {
  double latency_us = 0;  // half the median round trip of an 8-byte message
  double bandwidth = 0;   // GB/s: 2 x message bytes / median round trip
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// The initiating side of a link test with `partner` (which runs echo()).
Link measure_link(const Context& ctx, int partner, std::vector<char>& big, double seconds) {
  const int m = int(big.size());
  char small[8] = {};
  auto round_trip = [&](char* buf, int bytes) {
    MPI_Request r[2];
    const auto t = Clock::now();
    MPI_Isend(buf, bytes, MPI_BYTE, partner, kTagData, ctx.comm, &r[0]);
    MPI_Irecv(buf, bytes, MPI_BYTE, partner, kTagData, ctx.comm, &r[1]);
    wait_for(ctx, r, 2, partner, "link test", nullptr, Poll::busy);
    return since(t);
  };
  round_trip(small, 8);  // connection set-up (TCP connects on first use), page faults
  round_trip(big.data(), m);
  Link out;
  std::vector<double> rtt;
  auto t0 = Clock::now();
  for (int i = 0; i < 2000 && (i < 10 || since(t0) < seconds / 3); ++i)
    rtt.push_back(round_trip(small, 8));
  out.latency_us = median(rtt) / 2 * 1e6;
  rtt.clear();
  t0 = Clock::now();
  for (int i = 0; i < 50 && (i < 2 || since(t0) < seconds); ++i)
    rtt.push_back(round_trip(big.data(), m));
  out.bandwidth = 2.0 * double(m) / median(rtt) / 1e9;
  MPI_Request r;
  MPI_Isend(small, 0, MPI_BYTE, partner, kTagDone, ctx.comm, &r);
  wait_for(ctx, &r, 1, partner, "link test");
  return out;
}

// The answering side: sends every message back until the initiator says done.
void echo(const Context& ctx, int partner, std::vector<char>& big) {
  for (;;) {
    MPI_Request r;
    MPI_Status st;
    MPI_Irecv(big.data(), int(big.size()), MPI_BYTE, partner, MPI_ANY_TAG, ctx.comm, &r);
    wait_for(ctx, &r, 1, partner, "link test", &st, Poll::busy);
    if (st.MPI_TAG == kTagDone) return;
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    MPI_Isend(big.data(), count, MPI_BYTE, partner, kTagData, ctx.comm, &r);
    wait_for(ctx, &r, 1, partner, "link test", nullptr, Poll::busy);
  }
}

using Pairs = std::vector<std::pair<int, int>>;

// Links (r, r+1 mod w) in phases where every rank is in one link at most: even r, odd r,
// and for odd w the closing link alone.
std::vector<Pairs> ring_phases(int w) {
  if (w < 2) return {};
  if (w == 2) return {{{0, 1}}};
  std::vector<Pairs> phases(w % 2 ? 3 : 2);
  for (int r = 0; r < w; ++r)
    phases[size_t(w % 2 && r == w - 1 ? 2 : r % 2)].push_back({r, (r + 1) % w});
  return phases;
}

// Every pair of n nodes in n-1 (n even) or n (n odd) rounds of disjoint pairs (the circle
// method); beyond kAllPairsNodes, the ring of nodes only.
constexpr int kAllPairsNodes = 32;
std::vector<Pairs> node_rounds(int n) {
  if (n < 2) return {};
  if (n > kAllPairsNodes) return ring_phases(n);
  const int m = n + n % 2;  // with a bye for odd n
  std::vector<Pairs> rounds;
  for (int k = 0; k < m - 1; ++k) {
    Pairs round;
    auto add = [&](int i, int j) {
      if (i < n && j < n) round.push_back({std::min(i, j), std::max(i, j)});
    };
    add(k, m - 1);
    for (int i = 1; i < m / 2; ++i) add((k + i) % (m - 1), (k - i + m - 1) % (m - 1));
    rounds.push_back(round);
  }
  return rounds;
}

// Runs the links of each phase concurrently; results[link index] on the initiator.
void run_links(const Context& ctx, int rank, int w, const std::vector<Pairs>& phases,
               const std::vector<int>& rank_of, std::vector<char>& big, double seconds,
               std::map<std::pair<int, int>, Link>& results) {
  for (const Pairs& phase : phases) {
    for (const auto& [a, b] : phase) {
      const int ra = rank_of[size_t(a)], rb = rank_of[size_t(b)];
      if (rank == ra) results[{a, b}] = measure_link(ctx, rb, big, seconds);
      if (rank == rb) echo(ctx, ra, big);
    }
    barrier(ctx, rank, w, "the barrier between link tests");
  }
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const size_t lo = size_t(std::floor(pos)), hi = size_t(std::ceil(pos));
  return v[lo] + (pos - double(lo)) * (v[hi] - v[lo]);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string pad(const std::string& s, size_t w, bool right = true) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

// Marks of one kind: the reference (upper quartile of rates, lower of latencies) and which
// values are outliers.
struct Judge {
  double outlier;
  double rate_ref(const std::vector<double>& v) const {
    return v.size() < 2 ? 0 : quantile(v, 0.75);
  }
  double lat_ref(const std::vector<double>& v) const {
    return v.size() < 2 ? 0 : quantile(v, 0.25);
  }
  bool slow_rate(double v, double ref) const { return ref > 0 && v < outlier * ref; }
  bool slow_latency(double v, double ref) const { return ref > 0 && v > ref / (outlier * outlier); }
};

}  // namespace

bool parse_doctor(const std::vector<std::string>& args, DoctorConfig& c, std::string* help) {
  using namespace opts;
  // clang-format off
  po::options_description d("doctor options");
  d.add_options()
      ("threads", value_or_default(&c.threads), "threads per rank (0: as for train)")
      ("gemm-size", value_or_default(&c.gemm_size), "n of the n x n x n fp32 GEMM each rank times")
      ("stream-mib", value_or_default(&c.stream_mib), "MiB per array of the memory-bandwidth triad (3 arrays per rank)")
      ("message-mib", value_or_default(&c.message_mib), "MiB per message of the link bandwidth test")
      ("seconds", value_or_default(&c.seconds), "seconds each measurement runs (GEMM, triad, each link)")
      ("outlier", value_or_default(&c.outlier), "mark a rate below this fraction of the upper quartile of its kind (latency: above the lower quartile / outlier^2)")
      ("timeout", value_or_default(&c.timeout), "seconds to wait for a partner rank before ending the job, naming it")
      ("strict", po::bool_switch(&c.strict), "exit 2 when anything is marked (default: warnings, exit 0)")
      ("bad-hosts", po::value(&c.bad_hosts), "FILE: write the hosts of marked ranks and nodes, one per line (empty: none), e.g. for sbatch --exclude");
  // clang-format on
  po::options_description desc(
      "usage: ringtrain doctor [options]   (under mpirun or srun, before training)\n"
      "Times a GEMM and the memory bandwidth on every rank, the link of every rank to its ring\n"
      "neighbour and of every node pair's leaders, and marks the outliers");
  desc.add(general_options()).add(d).add(debug_options());
  po::variables_map vm;
  if (!parse("doctor", desc, args, vm, help)) return false;
  RT_REQUIRE(c.threads >= 0, "--threads ", c.threads,
             " is not valid: must be >= 0 (0: as for train)");
  RT_REQUIRE(c.gemm_size >= 16 && c.gemm_size <= 16384, "--gemm-size ", c.gemm_size,
             " is not valid: expected 16 to 16384");
  RT_REQUIRE(c.stream_mib >= 1 && c.stream_mib <= 65536, "--stream-mib ", c.stream_mib,
             " is not valid: expected 1 to 65536");
  RT_REQUIRE(c.message_mib >= 1 && c.message_mib <= 1024, "--message-mib ", c.message_mib,
             " is not valid: expected 1 to 1024");
  require_positive(c.seconds, "seconds", 600);
  require_positive(c.timeout, "timeout", 86400);
  require_unit(c.outlier, "outlier");
  RT_REQUIRE(c.outlier > 0, "--outlier 0 is not valid: expected a fraction in (0, 1), e.g. 0.7");
  if (vm.count("print-config")) {
    *help = config_text(desc, vm);
    return false;
  }
  return true;
}

int run_doctor(const DoctorConfig& cfg, comm::Communicator& comm) {
  const int w = comm.size(), rank = comm.rank();
  Context ctx{comm.mpi(), cfg.timeout, rank_hosts(comm)};
  const int threads = threads_for_rank(cfg.threads, comm);
  // Where every rank is: node index and local rank.
  std::vector<int> where(static_cast<size_t>(2 * w));
  {
    int mine[2] = {comm.node(), comm.local_rank()};
    MPI_Request r;
    MPI_Iallgather(mine, 2, MPI_INT, where.data(), 2, MPI_INT, ctx.comm, &r);
    wait_for(ctx, &r, 1, -1, "the exchange of placements");
  }
  const int nodes = comm.num_nodes();
  std::vector<int> node_of(static_cast<size_t>(w)), leader(static_cast<size_t>(nodes), -1),
      identity(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) {
    node_of[size_t(r)] = where[size_t(2 * r)];
    identity[size_t(r)] = r;
    if (where[size_t(2 * r + 1)] == 0) leader[size_t(node_of[size_t(r)])] = r;
  }
  const auto start = Clock::now();

  // 1. Compute and memory, every rank at once (as training loads them).
  std::unique_ptr<kernels::Backend> backend = make_backend(Device{}, threads, "grow");
  barrier(ctx, rank, w, "the barrier before the GEMM test");
  const double gflops = gemm_rate(*backend, cfg.gemm_size, cfg.seconds);
  barrier(ctx, rank, w, "the barrier before the memory test");
  const double membw = triad_rate(cfg.stream_mib, threads, cfg.seconds);
  const StallHook stall = stall_hook();  // test hooks (core/fault_injection.hpp)
  if (stall.rank == rank && stall.step == 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(stall.seconds));
  maybe_inject_fault("doctor");
  barrier(ctx, rank, w, "the barrier before the link tests");

  // 2. Links: ring neighbours, then node leaders pairwise.
  std::vector<char> big(size_t(cfg.message_mib) << 20, 1);
  std::map<std::pair<int, int>, Link> ring_links, node_links;
  run_links(ctx, rank, w, ring_phases(w), identity, big, cfg.seconds, ring_links);
  const std::vector<Pairs> rounds = node_rounds(nodes);
  run_links(ctx, rank, w, rounds, leader, big, cfg.seconds, node_links);

  // 3. Everything to rank 0.
  std::vector<double> mine = {gflops, membw, 0, 0};
  if (const auto it = ring_links.find({rank, (rank + 1) % w}); it != ring_links.end()) {
    mine[2] = it->second.latency_us;
    mine[3] = it->second.bandwidth;
  }
  std::vector<double> all(static_cast<size_t>(4 * w));
  {
    MPI_Request r;
    MPI_Igather(mine.data(), 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, 0, ctx.comm, &r);
    wait_for(ctx, &r, 1, -1, "the gathering of results");
  }
  const size_t nn = size_t(nodes) * size_t(nodes);
  std::vector<double> pair_mine(2 * nn, 0), pair_all(2 * nn, 0);
  for (const auto& [p, l] : node_links) {
    pair_mine[size_t(p.first * nodes + p.second)] = l.latency_us;
    pair_mine[nn + size_t(p.first * nodes + p.second)] = l.bandwidth;
  }
  {
    MPI_Request r;
    MPI_Ireduce(pair_mine.data(), pair_all.data(), int(2 * nn), MPI_DOUBLE, MPI_MAX, 0, ctx.comm,
                &r);
    wait_for(ctx, &r, 1, -1, "the gathering of results");
  }

  int marked = 0;
  if (rank == 0) {
    const Judge judge{cfg.outlier};
    std::vector<std::string> warnings;
    std::set<std::string> bad_hosts;
    auto col = [&](int k) {
      std::vector<double> v;
      for (int r = 0; r < w; ++r) v.push_back(all[size_t(4 * r + k)]);
      return v;
    };
    const std::vector<double> g = col(0), mem = col(1);
    const double g_ref = judge.rate_ref(g), m_ref = judge.rate_ref(mem);
    // Ring links by kind: within a node (shared memory) and between nodes (the network).
    std::vector<double> lat_kind[2], bw_kind[2];
    auto kind_of = [&](int r) {
      return node_of[size_t(r)] == node_of[size_t((r + 1) % w)] ? 0 : 1;
    };
    const bool has_ring = w >= 2;
    for (int r = 0; has_ring && r < w; ++r) {
      if (w == 2 && r == 1) break;  // one link between two ranks
      lat_kind[kind_of(r)].push_back(all[size_t(4 * r + 2)]);
      bw_kind[kind_of(r)].push_back(all[size_t(4 * r + 3)]);
    }
    double lat_ref[2], bw_ref[2];
    for (int k = 0; k < 2; ++k) {
      lat_ref[k] = judge.lat_ref(lat_kind[k]);
      bw_ref[k] = judge.rate_ref(bw_kind[k]);
    }
    std::string out =
        cat("ringtrain doctor: ", w, " rank", w == 1 ? "" : "s", " on ", nodes, " node",
            nodes == 1 ? "" : "s", ", ", threads, " thread", threads == 1 ? "" : "s",
            " on rank 0; GEMM fp32 ", cfg.gemm_size, "^3 (", kernels::describe_cpu_gemm(),
            "), triad 3 x ", cfg.stream_mib, " MiB, messages 8 B and ", cfg.message_mib, " MiB\n");
    out += cat("marked '!': a rate below ", fmt("%.2f", cfg.outlier),
               " x the upper quartile of its kind, a latency above the lower quartile / ",
               fmt("%.2f", cfg.outlier * cfg.outlier), "\n\n");
    out +=
        "  rank  host                  node  GEMM GFLOP/s  memory GB/s   link to  kind  "
        "latency us  bandwidth GB/s\n";
    auto mark = [](bool m) { return std::string(m ? "!" : " "); };
    for (int r = 0; r < w; ++r) {
      const std::string host = ctx.hosts[size_t(r)];
      const bool gm = judge.slow_rate(g[size_t(r)], g_ref),
                 mm = judge.slow_rate(mem[size_t(r)], m_ref);
      if (gm) {
        warnings.push_back(cat("rank ", r, " on ", host, ": GEMM ", fmt("%.1f", g[size_t(r)]),
                               " GFLOP/s, ", fmt("%.2f", g[size_t(r)] / g_ref),
                               " x the ranks' upper quartile ", fmt("%.1f", g_ref),
                               " (a busy or throttled core, or fewer threads?)"));
        bad_hosts.insert(host);
      }
      if (mm) {
        warnings.push_back(cat("rank ", r, " on ", host, ": memory ", fmt("%.1f", mem[size_t(r)]),
                               " GB/s, ", fmt("%.2f", mem[size_t(r)] / m_ref),
                               " x the ranks' upper quartile ", fmt("%.1f", m_ref)));
        bad_hosts.insert(host);
      }
      out += cat(pad(std::to_string(r), 6), "  ", pad(host, 20, false),
                 pad(std::to_string(node_of[size_t(r)]), 6), pad(fmt("%.1f", g[size_t(r)]), 13),
                 mark(gm), pad(fmt("%.1f", mem[size_t(r)]), 11), mark(mm));
      if (has_ring && !(w == 2 && r == 1)) {
        const int k = kind_of(r), next = (r + 1) % w;
        const double lat = all[size_t(4 * r + 2)], bw = all[size_t(4 * r + 3)];
        const bool lm = judge.slow_latency(lat, lat_ref[k]), bm = judge.slow_rate(bw, bw_ref[k]);
        out += cat(pad(std::to_string(next), 10), "  ", k == 0 ? "node" : "net ",
                   pad(fmt("%.1f", lat), 12), mark(lm), pad(fmt("%.3f", bw), 15), mark(bm));
        if (lm || bm) {
          warnings.push_back(
              cat("link rank ", r, " (", host, ") - rank ", next, " (", ctx.hosts[size_t(next)],
                  "), ", k == 0 ? "within a node" : "between nodes", ": ",
                  bm ? cat(fmt("%.3f", bw), " GB/s, ", fmt("%.2f", bw / bw_ref[k]),
                           " x the upper quartile ", fmt("%.3f", bw_ref[k]))
                     : std::string(),
                  bm && lm ? "; " : "",
                  lm ? cat("latency ", fmt("%.1f", lat), " us against ", fmt("%.1f", lat_ref[k]))
                     : std::string()));
          if (k == 0) bad_hosts.insert(host);
        }
      }
      out += "\n";
    }
    // Node pairs.
    if (nodes >= 2) {
      std::vector<std::pair<int, int>> pairs;
      std::vector<double> lats, bws;
      for (const Pairs& round : rounds)
        for (const auto& p : round) {
          pairs.push_back(p);
          lats.push_back(pair_all[size_t(p.first * nodes + p.second)]);
          bws.push_back(pair_all[nn + size_t(p.first * nodes + p.second)]);
        }
      std::sort(pairs.begin(), pairs.end());
      const double pl_ref = judge.lat_ref(lats), pb_ref = judge.rate_ref(bws);
      const bool all_pairs = nodes <= kAllPairsNodes;
      out += cat("\n  node pairs (", all_pairs ? "every pair" : "the ring of nodes",
                 ", between their local rank 0s)           latency us  bandwidth GB/s\n");
      std::vector<int> marked_links(size_t(nodes), 0), links(size_t(nodes), 0);
      const bool list_all = pairs.size() <= 64;
      int shown = 0;
      for (const auto& [a, b] : pairs) {
        const double lat = pair_all[size_t(a * nodes + b)],
                     bw = pair_all[nn + size_t(a * nodes + b)];
        const bool lm = judge.slow_latency(lat, pl_ref), bm = judge.slow_rate(bw, pb_ref);
        ++links[size_t(a)];
        ++links[size_t(b)];
        if (lm || bm) {
          ++marked_links[size_t(a)];
          ++marked_links[size_t(b)];
          warnings.push_back(
              cat("node ", a, " (", ctx.hosts[size_t(leader[size_t(a)])], ") - node ", b, " (",
                  ctx.hosts[size_t(leader[size_t(b)])], "): ",
                  bm ? cat(fmt("%.3f", bw), " GB/s, ", fmt("%.2f", bw / pb_ref),
                           " x the upper quartile ", fmt("%.3f", pb_ref))
                     : std::string(),
                  bm && lm ? "; " : "",
                  lm ? cat("latency ", fmt("%.1f", lat), " us against ", fmt("%.1f", pl_ref))
                     : std::string()));
        }
        if (list_all || lm || bm) {
          out += cat("  ",
                     pad(cat("node ", a, " (", ctx.hosts[size_t(leader[size_t(a)])], ") - node ", b,
                             " (", ctx.hosts[size_t(leader[size_t(b)])], ")"),
                         60, false),
                     pad(fmt("%.1f", lat), 10), mark(lm), pad(fmt("%.3f", bw), 15), mark(bm), "\n");
          ++shown;
        }
      }
      if (!list_all)
        out += cat("  (", pairs.size() - size_t(shown), " unmarked pairs not listed; median ",
                   fmt("%.1f", median(lats)), " us, ", fmt("%.3f", median(bws)), " GB/s)\n");
      // A node in most of its marked links is the suspect, not its partners.
      for (int n = 0; n < nodes; ++n)
        if (links[size_t(n)] > 0 && marked_links[size_t(n)] * 2 > links[size_t(n)] &&
            links[size_t(n)] > 1) {
          const std::string host = ctx.hosts[size_t(leader[size_t(n)])];
          warnings.push_back(cat("node ", n, " (", host, ") is in ", marked_links[size_t(n)],
                                 " of its ", links[size_t(n)],
                                 " node links marked: suspect its network"));
          bad_hosts.insert(host);
        }
    }
    marked = int(warnings.size());
    out += cat("\n",
               warnings.empty()
                   ? std::string("no outliers")
                   : cat(warnings.size(), " warning", warnings.size() == 1 ? "" : "s", ":"),
               "\n");
    for (const std::string& line : warnings) out += cat("  ", line, "\n");
    out += cat("doctor: ", fmt("%.1f", since(start)), " s\n");
    std::string trimmed;  // no trailing blanks where a line ends in an unmarked column
    for (size_t at = 0; at < out.size();) {
      size_t end = out.find('\n', at);
      if (end == std::string::npos) end = out.size();
      std::string line = out.substr(at, end - at);
      line.erase(line.find_last_not_of(' ') + 1);
      trimmed += line + "\n";
      at = end + 1;
    }
    std::cout << trimmed << std::flush;
    if (!cfg.bad_hosts.empty()) {
      std::ofstream f(cfg.bad_hosts, std::ios::trunc);
      for (const std::string& h : bad_hosts) f << h << "\n";
      f.close();
      if (!f)
        throw Error(ErrorKind::input,
                    cat("--bad-hosts ", cfg.bad_hosts, ": cannot write the file"));
    }
  }
  MPI_Request r;
  MPI_Ibcast(&marked, 1, MPI_INT, 0, ctx.comm, &r);
  wait_for(ctx, &r, 1, 0, "the result");
  return marked;
}

int cmd_doctor(const std::vector<std::string>& args, comm::Communicator& comm) {
  DoctorConfig cfg;
  std::string help;
  bool go = true;
  run_and_agree(comm, [&] { go = parse_doctor(args, cfg, &help); });
  if (!go) {
    if (comm.rank() == 0) std::cout << help;
    return 0;
  }
  if (!cfg.bad_hosts.empty())
    run_and_agree(comm, [&] {
      if (comm.rank() != 0) return;
      std::ofstream f(cfg.bad_hosts, std::ios::app);
      RT_REQUIRE(f.good(), "--bad-hosts ", cfg.bad_hosts, ": cannot write the file");
    });
  const int marked = run_or_fail([&] { return run_doctor(cfg, comm); });
  return marked > 0 && cfg.strict ? 2 : 0;
}

}  // namespace ringtrain::launch
