// TFRecord + protobuf encoding of TensorBoard events (see tensorboard.hpp).
#include "train/tensorboard.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.hpp"

namespace ringtrain::launch {

uint32_t crc32c(const void* data, size_t n) {
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xffffffffu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

namespace {

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// Protocol-buffer wire format: varints, tagged fields.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += char((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += char(v);
}
void key(std::string& out, int field, int wire) {
  varint(out, uint64_t(field) << 3 | uint64_t(wire));
}
void bytes_field(std::string& out, int field, const std::string& v) {
  key(out, field, 2);
  varint(out, v.size());
  out += v;
}
void double_field(std::string& out, int field, double v) {
  key(out, field, 1);
  char b[8];
  std::memcpy(b, &v, 8);
  out.append(b, 8);
}
void float_field(std::string& out, int field, float v) {
  key(out, field, 5);
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}
void int_field(std::string& out, int field, int64_t v) {
  key(out, field, 0);
  varint(out, uint64_t(v));
}
void packed_doubles(std::string& out, int field, const std::vector<double>& v) {
  std::string body;
  for (double d : v) {
    char b[8];
    std::memcpy(b, &d, 8);
    body.append(b, 8);
  }
  bytes_field(out, field, body);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event { wall_time = 1; step = 2; summary = 5 } with Summary { repeated Value value = 1 }.
std::string event_with_value(int64_t step, const std::string& value) {
  std::string summary, event;
  bytes_field(summary, 1, value);
  double_field(event, 1, now_seconds());
  int_field(event, 2, step);
  bytes_field(event, 5, summary);
  return event;
}

// TensorFlow's default histogram buckets: +-1e-12 * 1.1^k up to 1e20, and 0.
const std::vector<double>& default_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> pos;
    for (double v = 1e-12; v < 1e20; v *= 1.1) pos.push_back(v);
    std::vector<double> all;
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), pos.begin(), pos.end());
    all.push_back(std::numeric_limits<double>::max());
    return all;
  }();
  return limits;
}

}  // namespace

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  // The pid keeps two runs that start in the same second apart.
  path_ = cat(dir, "/events.out.tfevents.", int64_t(now_seconds()), ".", host, ".", getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  RT_REQUIRE(file_, "--tensorboard '", dir, "': cannot create '", path_,
             "': ", std::strerror(errno));
  std::string first;
  double_field(first, 1, now_seconds());
  bytes_field(first, 3, "brain.Event:2");  // file_version
  write_event(first);
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::write_event(const std::string& event) {
  char len[8];
  const uint64_t n = event.size();
  std::memcpy(len, &n, 8);  // little-endian on every platform ringtrain builds for
  const uint32_t lc = masked(crc32c(len, 8)), dc = masked(crc32c(event.data(), event.size()));
  const bool ok = std::fwrite(len, 1, 8, file_) == 8 && std::fwrite(&lc, 4, 1, file_) == 1 &&
                  std::fwrite(event.data(), 1, event.size(), file_) == event.size() &&
                  std::fwrite(&dc, 4, 1, file_) == 1;
  if (!ok) fail("writing");
  flush();  // one record at a time: a crash or a full disk never leaves a silent gap
}

void EventWriter::fail(const char* doing) {
  const int err = errno;
  throw_runtime(__FILE__, __LINE__,
                cat(doing, " --tensorboard file '", path_, "' failed: ", std::strerror(err)));
}

void EventWriter::scalar(const std::string& tag, int64_t step, double value) {
  std::string v;  // Summary.Value { tag = 1; simple_value = 2 }
  bytes_field(v, 1, tag);
  float_field(v, 2, float(value));
  write_event(event_with_value(step, v));
}

void EventWriter::histogram(const std::string& tag, int64_t step, const float* values, int64_t n) {
  const auto& limits = default_limits();
  std::vector<double> counts(limits.size(), 0.0);
  double mn = INFINITY, mx = -INFINITY, sum = 0, sq = 0;
  int64_t finite = 0;  // inf/nan are left out of every statistic
  for (int64_t i = 0; i < n; ++i) {
    const double x = values[i];
    if (!std::isfinite(x)) continue;
    ++finite;
    mn = std::min(mn, x);
    mx = std::max(mx, x);
    sum += x;
    sq += x * x;
    counts[size_t(std::lower_bound(limits.begin(), limits.end(), x) - limits.begin())] += 1;
  }
  // Like TensorFlow: only the non-empty buckets, each with its upper limit.
  std::vector<double> lim, cnt;
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] > 0) {
      lim.push_back(limits[i]);
      cnt.push_back(counts[i]);
    }
  std::string
      h;  // HistogramProto { min 1, max 2, num 3, sum 4, sum_squares 5, limits 6, counts 7 }
  double_field(h, 1, finite ? mn : 0);
  double_field(h, 2, finite ? mx : 0);
  double_field(h, 3, double(finite));
  double_field(h, 4, sum);
  double_field(h, 5, sq);
  packed_doubles(h, 6, lim);
  packed_doubles(h, 7, cnt);
  std::string v;  // Summary.Value { tag = 1; histo = 5 }
  bytes_field(v, 1, tag);
  bytes_field(v, 5, h);
  write_event(event_with_value(step, v));
}

// SummaryMetadata { plugin_data = 1 { plugin_name = 1; content = 2 } }.
std::string plugin_metadata(const std::string& plugin, const std::string& content) {
  std::string pd, md;
  bytes_field(pd, 1, plugin);
  if (!content.empty()) bytes_field(pd, 2, content);
  bytes_field(md, 1, pd);
  return md;
}

void EventWriter::text(const std::string& tag, int64_t step, const std::string& markdown) {
  // TensorProto { dtype = 1 (DT_STRING = 7); tensor_shape = 2 (scalar: empty); string_val = 8 }
  std::string tensor;
  int_field(tensor, 1, 7);
  bytes_field(tensor, 2, "");
  bytes_field(tensor, 8, markdown);
  std::string v;  // Summary.Value { tag = 1; tensor = 8; metadata = 9 }
  bytes_field(v, 1, tag);
  bytes_field(v, 8, tensor);
  bytes_field(v, 9, plugin_metadata("text", ""));
  write_event(event_with_value(step, v));
}

void EventWriter::hparams(const std::vector<std::pair<std::string, std::string>>& values) {
  // HParamsPluginData { version = 1 (0); session_start_info = 3 { hparams = 1: map<string,
  // google.protobuf.Value { number_value = 2 | string_value = 3 }> } }
  std::string start;
  for (const auto& [name, text] : values) {
    std::string value, entry;
    char* end = nullptr;
    const double d = std::strtod(text.c_str(), &end);
    if (!text.empty() && end && *end == '\0' && std::isfinite(d))
      double_field(value, 2, d);
    else
      bytes_field(value, 3, text);
    bytes_field(entry, 1, name);
    bytes_field(entry, 2, value);
    bytes_field(start, 1, entry);
  }
  std::string data;
  int_field(data, 1, 0);
  bytes_field(data, 3, start);
  std::string v;  // a Value with only tag and metadata, as TensorBoard's hparams API writes
  bytes_field(v, 1, "_hparams_/session_start_info");
  bytes_field(v, 9, plugin_metadata("hparams", data));
  write_event(event_with_value(0, v));
}

void EventWriter::flush() {
  if (std::fflush(file_) != 0 || std::ferror(file_)) fail("writing");
}

}  // namespace ringtrain::launch
