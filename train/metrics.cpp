// JSON-lines metrics (see metrics.hpp).
#include "train/metrics.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/error.hpp"
#include "io/output_file.hpp"

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

JsonLine& JsonLine::add(const std::string& k, int64_t v) {
  key(k);
  body_ += std::to_string(v);
  return *this;
}

JsonLine& JsonLine::add(const std::string& k, bool v) {
  key(k);
  body_ += v ? "true" : "false";
  return *this;
}

JsonLine& JsonLine::add(const std::string& k, const JsonLine& object) {
  key(k);
  body_ += object.str();
  return *this;
}

JsonLine& JsonLine::add(const std::string& k, const std::vector<JsonLine>& objects) {
  key(k);
  body_ += "[";
  for (size_t i = 0; i < objects.size(); ++i) {
    if (i) body_ += ',';
    body_ += objects[i].str();
  }
  body_ += "]";
  return *this;
}

JsonLine& JsonLine::add(const std::string& k, const std::vector<std::vector<int64_t>>& rows) {
  key(k);
  body_ += "[";
  for (size_t i = 0; i < rows.size(); ++i) {
    body_ += i ? ",[" : "[";
    for (size_t j = 0; j < rows[i].size(); ++j) {
      if (j) body_ += ',';
      body_ += std::to_string(rows[i][j]);
    }
    body_ += "]";
  }
  body_ += "]";
  return *this;
}

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (path.empty()) return;
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  RT_REQUIRE(fd_ >= 0, "--metrics '", path,
             "' cannot be opened for writing: ", std::strerror(errno));
}

MetricsWriter::MetricsWriter(MetricsWriter&& o) noexcept
    : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)) {}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const JsonLine& line) {
  if (fd_ < 0) return;
  const std::string text = line.str() + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0 || io::no_space_errno(errno)) io::throw_disk_full("writing --metrics", path_);
      throw_runtime(__FILE__, __LINE__,
                    cat("writing --metrics '", path_, "' failed: ", std::strerror(errno)));
    }
    done += size_t(n);
  }
}

void MetricsWriter::close() {
  if (fd_ < 0) return;
  const int rc = ::close(std::exchange(fd_, -1));
  if (rc != 0 && io::no_space_errno(errno)) io::throw_disk_full("closing --metrics", path_);
  if (rc != 0)
    throw_runtime(__FILE__, __LINE__,
                  cat("closing --metrics '", path_, "' failed: ", std::strerror(errno)));
}

}  // namespace ringtrain::launch
