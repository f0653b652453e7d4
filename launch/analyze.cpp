// `ringtrain analyze DIR` (see analyze.hpp): parses the dumps with nlohmann-json, line by
// line, so that a truncated line or file costs only what it lost.
#include "launch/analyze.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>

#include "comm/flight_recorder.hpp"
#include "core/error.hpp"
#include "train/job.hpp"

namespace ringtrain::launch {
namespace {

using json = nlohmann::json;

struct Entry {
  bool collective = false;
  int64_t seq = -1, step = 0, bucket = -1, bytes = 0, count = 0;
  std::string kind, comm, dtype, thread;
  double start = 0;
  std::optional<double> end;
};

struct Dump {
  std::string file;
  int rank = -1, world = 0;
  std::string host, job, reason;
  std::vector<std::string> hosts;
  double dumped_at = 0;
  int64_t recorded = 0, capacity = 0, step = 0;
  std::vector<Entry> entries;
  bool header = false, complete = false;
  int64_t bad_lines = 0, promised = -1;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string size_str(int64_t bytes) {
  if (bytes >= (int64_t(1) << 20)) return fmt("%.1f MiB", double(bytes) / double(1 << 20));
  if (bytes >= 1024) return fmt("%.1f KiB", double(bytes) / 1024.0);
  return cat(bytes, " B");
}

std::string ranks_str(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

template <typename T>
T get_or(const json& j, const char* key, T fallback) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    return fallback;
  }
}

Dump read_dump(const std::filesystem::path& path) {
  Dump d;
  d.file = path.filename().string();
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      ++d.bad_lines;
      continue;
    }
    const std::string type = get_or<std::string>(j, "type", "");
    if (type == "flight_recorder") {
      d.header = true;
      d.rank = get_or<int>(j, "rank", -1);
      d.world = get_or<int>(j, "world_size", 0);
      d.host = get_or<std::string>(j, "host", "?");
      d.job = get_or<std::string>(j, "job", "");
      d.reason = get_or<std::string>(j, "reason", "");
      d.dumped_at = get_or<double>(j, "dumped_at", 0);
      d.recorded = get_or<int64_t>(j, "recorded", 0);
      d.capacity = get_or<int64_t>(j, "capacity", 0);
      d.step = get_or<int64_t>(j, "step", 0);
      if (j.contains("hosts") && j["hosts"].is_array())
        for (const auto& h : j["hosts"])
          d.hosts.push_back(h.is_string() ? h.get<std::string>() : "?");
    } else if (type == "collective" || type == "phase") {
      Entry e;
      e.collective = type == "collective";
      e.seq = get_or<int64_t>(j, "seq", -1);
      e.step = get_or<int64_t>(j, "step", 0);
      e.bucket = get_or<int64_t>(j, "bucket", -1);
      e.bytes = get_or<int64_t>(j, "bytes", 0);
      e.count = get_or<int64_t>(j, "count", 0);
      e.kind = get_or<std::string>(j, e.collective ? "kind" : "name", "?");
      e.comm = get_or<std::string>(j, "comm", "");
      e.dtype = get_or<std::string>(j, "dtype", "");
      e.thread = get_or<std::string>(j, "thread", "");
      e.start = get_or<double>(j, "start", 0);
      if (j.contains("end") && j["end"].is_number()) e.end = j["end"].get<double>();
      d.entries.push_back(std::move(e));
    } else if (type == "end") {
      d.complete = true;
      d.promised = get_or<int64_t>(j, "entries", -1);
    } else {
      ++d.bad_lines;
    }
  }
  if (d.rank < 0) {  // no header: the rank from the file name
    std::smatch m;
    static const std::regex kName("flight-rank-([0-9]+)\\.jsonl");
    if (std::regex_match(d.file, m, kName)) d.rank = std::stoi(m[1]);
  }
  return d;
}

// The collective `seq` of a dump, or null.
const Entry* collective_at(const Dump& d, int64_t seq) {
  for (const Entry& e : d.entries)
    if (e.collective && e.seq == seq) return &e;
  return nullptr;
}

std::string describe(const Entry& e) {
  std::string out = cat(e.kind, " of ", size_str(e.bytes), " ", e.dtype);
  if (!e.comm.empty()) out += " on " + e.comm;
  out += cat(", step ", e.step);
  if (e.bucket >= 0) out += cat(", bucket ", e.bucket);
  return out;
}

class Report {
 public:
  explicit Report(std::vector<Dump> dumps) : dumps_(std::move(dumps)) {
    for (const Dump& d : dumps_) {
      world_ = std::max({world_, d.world, d.rank + 1});
      if (hosts_.size() < d.hosts.size()) hosts_ = d.hosts;
    }
  }
  std::string run() {
    files();
    hang();
    phases();
    slow();
    return out_;
  }

 private:
  std::string host(int rank) const {
    for (const Dump& d : dumps_)
      if (d.rank == rank && !d.host.empty()) return d.host;
    return size_t(rank) < hosts_.size() ? hosts_[size_t(rank)] : "?";
  }
  std::string who(int rank) const { return cat("rank ", rank, " on ", host(rank)); }
  void line(const std::string& s) { out_ += s + "\n"; }

  void files() {
    std::set<std::string> reasons;
    std::string job;
    for (const Dump& d : dumps_) {
      if (!d.reason.empty()) reasons.insert(d.reason);
      if (!d.job.empty()) job = d.job;
    }
    line(cat("flight-recorder dumps: ", dumps_.size(), " of ", world_, " ranks",
             job.empty() ? "" : cat(" (job ", job, ")")));
    for (const std::string& r : reasons) line("  reason: " + r);
    std::vector<int> missing;
    for (int r = 0; r < world_; ++r) {
      const bool have =
          std::any_of(dumps_.begin(), dumps_.end(), [&](const Dump& d) { return d.rank == r; });
      if (!have) missing.push_back(r);
    }
    for (int r : missing)
      line(cat("  missing: ", who(r),
               " left no dump (dead or killed before it could write, or it wrote elsewhere)"));
    for (const Dump& d : dumps_) {
      if (!d.header) line(cat("  partial: ", d.file, " has no header line (rank from its name)"));
      if (!d.complete || d.bad_lines > 0 ||
          (d.promised >= 0 && d.promised != int64_t(d.entries.size())))
        line(cat("  partial: ", d.file, " (", who(d.rank), "): ", d.entries.size(), " entries read",
                 d.promised >= 0 ? cat(" of ", d.promised) : std::string(),
                 d.complete ? "" : ", no end line",
                 d.bad_lines ? cat(", ", d.bad_lines, " unreadable line(s)") : std::string(),
                 " (killed while writing?)"));
      if (d.recorded > d.capacity && d.capacity > 0 && &d == &dumps_.front())
        line(cat("  each ring holds the last ", d.capacity, " entries (rank ", d.rank, " recorded ",
                 d.recorded, ")"));
    }
  }

  // The first collective some rank did not leave, and who entered it.
  void hang() {
    int64_t first = INT64_MAX;
    for (const Dump& d : dumps_) {
      int64_t hi = 0, open = INT64_MAX;
      for (const Entry& e : d.entries) {
        if (!e.collective) continue;
        hi = std::max(hi, e.seq);
        if (!e.end) open = std::min(open, e.seq);
      }
      // A dump cut short says nothing of the collectives after its last line.
      first = std::min(first, d.complete ? std::min(open, hi + 1) : open);
    }
    if (dumps_.empty() || first == INT64_MAX) return;
    std::vector<int> left, inside, never, passed, cut;
    const Entry* what = nullptr;
    std::map<std::string, std::vector<int>> kinds;
    for (const Dump& d : dumps_) {
      int64_t lo = INT64_MAX;
      for (const Entry& e : d.entries)
        if (e.collective) lo = std::min(lo, e.seq);
      const Entry* e = collective_at(d, first);
      if (e) {
        if (!what || !e->end) what = e;
        (e->end ? left : inside).push_back(d.rank);
        kinds[cat(e->kind, " of ", e->count, " ", e->dtype)].push_back(d.rank);
      } else if (lo != INT64_MAX && first < lo) {
        passed.push_back(d.rank);
      } else if (!d.complete) {
        cut.push_back(d.rank);
      } else {
        never.push_back(d.rank);
      }
    }
    if (!what) {
      int64_t last = first - 1;
      line(cat("collectives: every rank left every recorded collective (up to seq ", last,
               "); no rank is stuck in one"));
      return;
    }
    line(cat("first divergent collective: seq ", first, " (", describe(*what), ")"));
    if (kinds.size() > 1) {
      std::string s;
      for (const auto& [k, ranks] : kinds)
        s += cat(s.empty() ? "" : "; ", k, " on ", ranks_str(ranks));
      line("  MISMATCH: the ranks called different collectives as seq " + std::to_string(first) +
           ": " + s);
    }
    for (int r : never) {
      const Dump& d = dump_of(r);
      const Entry* last = nullptr;
      for (const Entry& e : d.entries)
        if (e.collective && (!last || e.seq > last->seq)) last = &e;
      line(cat("  never entered: ", who(r),
               last ? cat(" (its last collective: seq ", last->seq, ", ", describe(*last),
                          last->end ? ", left)" : ", not left)")
                    : std::string(" (no collective recorded)")));
    }
    std::vector<int> missing;
    for (int r = 0; r < world_; ++r)
      if (!has_dump(r)) missing.push_back(r);
    for (int r : missing) line(cat("  unknown: ", who(r), " (no dump)"));
    for (int r : cut) line(cat("  unknown: ", who(r), " (its dump is cut before seq ", first, ")"));
    if (!inside.empty()) {
      std::string waits;
      for (int r : inside) {
        const Dump& d = dump_of(r);
        const Entry* e = collective_at(d, first);
        waits += cat(waits.empty() ? "" : ", ", fmt("%.1f s", d.dumped_at - e->start));
      }
      line(cat("  entered, never left: ", ranks_str(inside), " (inside it for ", waits,
               " when dumped)"));
    }
    if (!left.empty()) line(cat("  entered and left: ", ranks_str(left)));
    if (!passed.empty()) line(cat("  past it (no longer in the ring): ", ranks_str(passed)));
    std::vector<int> unknown = missing;
    unknown.insert(unknown.end(), cut.begin(), cut.end());
    std::sort(unknown.begin(), unknown.end());
    auto names = [&](const std::vector<int>& ranks) {
      std::string out;
      for (int r : ranks) out += (out.empty() ? "" : "; ") + who(r);
      return out;
    };
    if (inside.empty()) return;
    const std::string waiting = cat(ranks_str(inside), inside.size() == 1 ? " waits" : " wait");
    if (!never.empty()) {
      line(cat("=> the job waits for ", names(never), ": ", waiting, " in seq ", first, " for ",
               never.size() == 1 ? "it" : "them"));
    } else if (!unknown.empty()) {
      line(cat(
          "=> no rank whose dump covers seq ", first, " stayed out of it; ", waiting,
          " in it, and the ranks the dumps do not show are the likely cause: ", names(unknown)));
    } else if (left.empty()) {
      line(cat("=> every rank entered seq ", first,
               " and none left it: a network, transport or MPI problem, not a rank"));
    }
  }

  const Dump& dump_of(int rank) const {
    for (const Dump& d : dumps_)
      if (d.rank == rank) return d;
    return dumps_.front();
  }
  bool has_dump(int rank) const {
    return std::any_of(dumps_.begin(), dumps_.end(), [&](const Dump& d) { return d.rank == rank; });
  }

  // Where each rank was when it dumped: its open phase (main thread) and open collectives.
  void phases() {
    line("phase of each rank when it dumped:");
    for (const Dump& d : dumps_) {
      const Entry* phase = nullptr;
      const Entry* last_phase = nullptr;
      std::vector<const Entry*> open_colls;
      for (const Entry& e : d.entries) {
        if (e.collective) {
          if (!e.end) open_colls.push_back(&e);
          continue;
        }
        last_phase = &e;
        if (!e.end) phase = &e;
      }
      std::string s = cat("  ", who(d.rank), ": step ", d.step);
      if (phase)
        s += cat(", in ", phase->kind, fmt(" (for %.1f s)", d.dumped_at - phase->start));
      else if (last_phase)
        s += cat(", after ", last_phase->kind, " of step ", last_phase->step);
      for (const Entry* e : open_colls)
        s += cat(", inside seq ", e->seq, " ", e->kind, " (", e->thread, " thread",
                 fmt(", %.1f s)", d.dumped_at - e->start));
      if (open_colls.empty()) {
        const Entry* last = nullptr;
        for (const Entry& e : d.entries)
          if (e.collective && (!last || e.seq > last->seq)) last = &e;
        if (last) s += cat(", no collective open (last: seq ", last->seq, " ", last->kind, ")");
      }
      if (!d.complete) s += " [its dump is cut short: later entries are lost]";
      line(s);
    }
  }

  // Per-rank mean time per step of each phase over the steps every dump holds completely.
  void slow() {
    static const char* kPhases[] = {"data",   "forward", "backward",
                                    "reduce", "unscale", "optimizer"};
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    for (const Dump& d : dumps_) {
      int64_t dlo = INT64_MAX, dhi = INT64_MIN;
      for (const Entry& e : d.entries)
        if (!e.collective && e.kind == "data") {
          dlo = std::min(dlo, e.step);
          if (e.end) dhi = std::max(dhi, e.step);
        }
      // The first step in the ring may have lost its earlier phases; the last may be open.
      lo = std::max(lo, dlo + 1);
      hi = std::min(hi, dhi - 1);
    }
    if (dumps_.empty() || lo > hi) {
      line("time per phase: too few complete steps in the dumps to compare the ranks");
      return;
    }
    const double steps = double(hi - lo + 1);
    struct Row {
      int rank;
      double phase[6] = {0, 0, 0, 0, 0, 0};
      double compute = 0, coll = 0;
    };
    std::vector<Row> rows;
    for (const Dump& d : dumps_) {
      Row row{d.rank};
      for (const Entry& e : d.entries) {
        if (e.step < lo || e.step > hi || !e.end) continue;
        const double t = *e.end - e.start;
        if (e.collective) {
          row.coll += t;
          continue;
        }
        for (size_t i = 0; i < 6; ++i)
          if (e.kind == kPhases[i]) row.phase[i] += t;
      }
      for (double& v : row.phase) v /= steps;
      row.coll /= steps;
      row.compute = row.phase[1] + row.phase[2];
      rows.push_back(row);
    }
    std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.rank < b.rank; });
    line(cat("time per step by phase (ms), steps ", lo, "-", hi, ":"));
    char buf[256];
    std::snprintf(buf, sizeof buf, "  %5s %-16s %8s %8s %8s %8s %8s %9s %8s %11s", "rank", "host",
                  "data", "forward", "backward", "reduce", "unscale", "optimizer", "compute",
                  "collectives");
    line(buf);
    for (const Row& r : rows) {
      std::snprintf(
          buf, sizeof buf, "  %5d %-16.16s %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %8.2f %11.2f",
          r.rank, host(r.rank).c_str(), r.phase[0] * 1e3, r.phase[1] * 1e3, r.phase[2] * 1e3,
          r.phase[3] * 1e3, r.phase[4] * 1e3, r.phase[5] * 1e3, r.compute * 1e3, r.coll * 1e3);
      line(buf);
    }
    std::vector<double> compute;
    for (const Row& r : rows) compute.push_back(r.compute);
    std::sort(compute.begin(), compute.end());
    const size_t m = compute.size() / 2;
    const double median = compute.size() % 2 ? compute[m] : 0.5 * (compute[m - 1] + compute[m]);
    const Row& slowest = *std::max_element(
        rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.compute < b.compute; });
    line(cat("slowest rank: ", who(slowest.rank), ": compute (forward + backward) ",
             fmt("%.2f ms/step", slowest.compute * 1e3),
             median > 0 ? fmt(", %.2fx", slowest.compute / median) : std::string(),
             fmt(" the median %.2f ms", median * 1e3),
             rows.size() > 1 ? "; the other ranks wait for it in reduce" : ""));
  }

  std::vector<Dump> dumps_;
  int world_ = 0;
  std::vector<std::string> hosts_;
  std::string out_;
};

}  // namespace

std::string analyze_flight_dumps(const std::string& dir) {
  std::error_code ec;
  RT_REQUIRE(std::filesystem::is_directory(dir, ec), "ringtrain analyze: '", dir,
             "' is not a directory; expected the --debug-dir (or --checkpoint-dir) of a job");
  std::vector<std::filesystem::path> files;
  std::vector<std::string> unfinished;
  static const std::regex kName("flight-rank-[0-9]+\\.jsonl(\\.tmp)?");
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, kName)) continue;
    if (m[1].matched)
      unfinished.push_back(name);
    else
      files.push_back(entry.path());
  }
  RT_REQUIRE(!files.empty(),
             "ringtrain analyze: no flight-recorder dump (flight-rank-*.jsonl) in '", dir,
             "'; a job writes them on a stall, an abort, SIGUSR2 or --flight-recorder-dump-step");
  std::sort(files.begin(), files.end());
  std::vector<Dump> dumps;
  for (const auto& f : files) dumps.push_back(read_dump(f));
  std::string out = Report(std::move(dumps)).run();
  for (const std::string& u : unfinished)
    out += cat("  note: ", u, " is a dump that was never finished (its writer was killed)\n");
  return out;
}

int cmd_analyze(const std::vector<std::string>& args, comm::Communicator& comm) {
  const char* usage =
      "usage: ringtrain analyze DIR\n"
      "  reads the flight-recorder dumps of a job (DIR/flight-rank-*.jsonl: --debug-dir, else\n"
      "  --checkpoint-dir) and prints the first collective where the ranks diverge, which ranks\n"
      "  never entered or never left it (with hosts), the phase each rank was in, and each\n"
      "  rank's time per phase with the slowest rank (docs/usage.md, \"Diagnosing a slow or\n"
      "  stuck job\").\n";
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    if (comm.rank() == 0) std::cout << usage;
    return 0;
  }
  run_and_agree(comm, [&] {
    RT_REQUIRE(args.size() == 1,
               "ringtrain analyze: expected one directory (usage: ringtrain analyze DIR)");
    if (comm.rank() == 0) std::cout << analyze_flight_dumps(args[0]) << std::flush;
  });
  return 0;
}

}  // namespace ringtrain::launch
