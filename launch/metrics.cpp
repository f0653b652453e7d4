// JSON-lines metrics (see metrics.hpp).
#include "launch/metrics.hpp"

#include <cmath>
#include <cstdio>

#include "core/error.hpp"

namespace ringtrain::launch {

void JsonLine::key(const std::string& k) {
  if (!body_.empty()) body_ += ",";
  body_ += "\"" + k + "\":";
}

JsonLine& JsonLine::add(const std::string& k, const std::string& v) {
  key(k);
  body_ += "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') body_ += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      body_ += buf;
      continue;
    }
    body_ += c;
  }
  body_ += "\"";
  return *this;
}

JsonLine& JsonLine::add(const std::string& k, double v) {
  key(k);
  if (!std::isfinite(v)) {  // JSON has no inf/nan
    body_ += "null";
    return *this;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  body_ += buf;
  return *this;
}

JsonLine& JsonLine::add_json(const std::string& k, const std::string& json) {
  key(k);
  body_ += json;
  return *this;
}

JsonLine& JsonLine::add(const std::string& k, int64_t v) {
  key(k);
  body_ += std::to_string(v);
  return *this;
}

MetricsWriter::MetricsWriter(const std::string& path) {
  if (path.empty()) return;
  out_.open(path, std::ios::app);
  RT_REQUIRE(out_.is_open(), "--metrics '", path, "' cannot be opened for writing");
}

void MetricsWriter::write(const JsonLine& line) {
  if (!out_.is_open()) return;
  out_ << line.str() << '\n';
  out_.flush();
}

}  // namespace ringtrain::launch
