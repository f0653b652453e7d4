// The flight recorder (see flight_recorder.hpp) and its JSON-lines dump.
#include "comm/flight_recorder.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace ringtrain::comm {
namespace {

std::atomic<FlightRecorder*> g_recorder{nullptr};
thread_local int64_t t_bucket = -1;
thread_local const char* t_thread = "main";

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A JSON string literal of `s` (host names, reasons: any byte may appear).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

}  // namespace

FlightRecorder::FlightRecorder(size_t capacity, std::string dir, Identity who)
    : capacity_(capacity > 0 ? capacity : 1), dir_(std::move(dir)), who_(std::move(who)) {
  ring_.resize(capacity_);
  steady0_ns_ = steady_ns();
  wall0_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count();
  g_recorder.store(this);
}

FlightRecorder::~FlightRecorder() {
  FlightRecorder* self = this;
  g_recorder.compare_exchange_strong(self, nullptr);
  stop_.store(true);
  if (dump_thread_.joinable()) dump_thread_.join();
}

FlightRecorder* FlightRecorder::instance() { return g_recorder.load(std::memory_order_acquire); }

uint64_t FlightRecorder::begin(const char* kind, const char* comm, int64_t seq, int64_t count,
                               DType dtype) {
  const int64_t now = steady_ns();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_++;
  FlightEntry& e = ring_[id % capacity_];
  e.id = id;
  e.seq = seq;
  e.kind = kind;
  e.comm = comm;
  e.thread = t_thread;
  e.step = step_.load(std::memory_order_relaxed);
  e.bucket = comm ? t_bucket : -1;
  e.count = count;
  e.dtype = dtype;
  e.start_ns = now;
  e.end_ns = 0;
  return id;
}

void FlightRecorder::end(uint64_t id) {
  const int64_t now = steady_ns();
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry& e = ring_[id % capacity_];
  if (e.id == id) e.end_ns = now;
}

std::vector<FlightEntry> FlightRecorder::snapshot(uint64_t* recorded) const {
  std::lock_guard<std::mutex> lock(mu_);
  *recorded = next_;
  std::vector<FlightEntry> out;
  const uint64_t first = next_ > capacity_ ? next_ - capacity_ : 0;
  out.reserve(size_t(next_ - first));
  for (uint64_t id = first; id < next_; ++id) out.push_back(ring_[id % capacity_]);
  return out;
}

std::string FlightRecorder::file_name(int rank) {
  char name[64];
  std::snprintf(name, sizeof name, "flight-rank-%05d.jsonl", rank);
  return name;
}

std::string FlightRecorder::dump(const std::string& reason) {
  if (dir_.empty()) return "";
  std::lock_guard<std::mutex> one(dump_mu_);
  uint64_t recorded = 0;
  const std::vector<FlightEntry> entries = snapshot(&recorded);
  auto unix_s = [&](int64_t steady) { return double(wall0_ns_ + (steady - steady0_ns_)) * 1e-9; };
  std::string out;
  out.reserve(200 * (entries.size() + 2));
  char buf[512];
  std::string hosts;
  for (const auto& h : who_.hosts) {
    if (!hosts.empty()) hosts += ',';
    hosts += json_string(h);
  }
  const std::string host =
      size_t(who_.rank) < who_.hosts.size() ? who_.hosts[size_t(who_.rank)] : "";
  std::snprintf(buf, sizeof buf,
                "{\"type\":\"flight_recorder\",\"format_version\":1,\"rank\":%d,\"world_size\":%d,"
                "\"pid\":%d,\"capacity\":%zu,\"recorded\":%llu,\"step\":%lld,\"dumped_at\":%.6f,",
                who_.rank, who_.world_size, int(getpid()), capacity_,
                static_cast<unsigned long long>(recorded),
                static_cast<long long>(step_.load(std::memory_order_relaxed)), unix_s(steady_ns()));
  out += buf;
  out += "\"host\":" + json_string(host) + ",\"job\":" + json_string(who_.job) +
         ",\"reason\":" + json_string(reason) + ",\"hosts\":[" + hosts + "]}\n";
  for (const FlightEntry& e : entries) {
    char end[40] = "null";
    if (e.end_ns != 0) std::snprintf(end, sizeof end, "%.6f", unix_s(e.end_ns));
    if (e.comm) {
      std::snprintf(buf, sizeof buf,
                    "{\"type\":\"collective\",\"id\":%llu,\"seq\":%lld,\"kind\":\"%s\","
                    "\"comm\":\"%s\",\"step\":%lld,\"bucket\":%lld,\"count\":%lld,\"bytes\":%lld,"
                    "\"dtype\":\"%s\",\"thread\":\"%s\",\"start\":%.6f,\"end\":%s}\n",
                    static_cast<unsigned long long>(e.id), static_cast<long long>(e.seq), e.kind,
                    e.comm, static_cast<long long>(e.step), static_cast<long long>(e.bucket),
                    static_cast<long long>(e.count),
                    static_cast<long long>(e.count * int64_t(dtype_size(e.dtype))),
                    dtype_name(e.dtype), e.thread, unix_s(e.start_ns), end);
    } else {
      std::snprintf(buf, sizeof buf,
                    "{\"type\":\"phase\",\"id\":%llu,\"name\":\"%s\",\"step\":%lld,"
                    "\"thread\":\"%s\",\"start\":%.6f,\"end\":%s}\n",
                    static_cast<unsigned long long>(e.id), e.kind, static_cast<long long>(e.step),
                    e.thread, unix_s(e.start_ns), end);
    }
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "{\"type\":\"end\",\"entries\":%zu}\n", entries.size());
  out += buf;

  const std::string path = (std::filesystem::path(dir_) / file_name(who_.rank)).string();
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  FILE* f = std::fopen(tmp.c_str(), "w");
  bool ok = f != nullptr;
  const int open_errno = errno;
  if (f) {
    ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
    ok = std::fflush(f) == 0 && ok;
    ok = std::fclose(f) == 0 && ok;
  }
  if (ok) ok = std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    const std::string line = "ringtrain: warning: could not write the flight-recorder dump '" +
                             tmp + "': " + std::strerror(f ? errno : open_errno) + "\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
    return "";
  }
  return path;
}

std::string FlightRecorder::dump_final(const std::string& reason) {
  if (final_done_.exchange(true)) return "";
  return dump(reason);
}

void FlightRecorder::dump_on_readable(int fd) {
  if (fd < 0 || dump_thread_.joinable()) return;
  dump_thread_ = std::thread([this, fd] {
    while (!stop_.load()) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0 || !(p.revents & POLLIN)) continue;
      char drain[64];
      if (read(fd, drain, sizeof drain) <= 0) continue;
      const std::string path = dump("SIGUSR2");
      const std::string rank = "ringtrain: rank " + std::to_string(who_.rank);
      const std::string line =
          !path.empty()  ? rank + " wrote its flight recorder to " + path + " (SIGUSR2)\n"
          : dir_.empty() ? rank +
                               " got SIGUSR2 but has no --debug-dir or --checkpoint-dir "
                               "to write its flight recorder into\n"
                         : std::string();  // the write error was reported
      if (!line.empty()) {
        [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
      }
    }
  });
}

FlightBucket::FlightBucket(int64_t bucket) : saved_(t_bucket) { t_bucket = bucket; }
FlightBucket::~FlightBucket() { t_bucket = saved_; }

void set_flight_thread_name(const char* name) { t_thread = name; }

}  // namespace ringtrain::comm
