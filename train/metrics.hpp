// The metrics file: JSON lines written by rank 0, one object per event with a "type"
// (start, resume, step, eval, skip, checkpoint, best, warning, stop), each line one write(2)
// so a crash loses nothing written, and a failed write (a full disk, /dev/full) a runtime
// error naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ringtrain::launch {

// One JSON object built field by field: JsonLine().add("type", "step").add("loss", 0.5).str()
class JsonLine {
 public:
  JsonLine& add(const std::string& key, const std::string& v);
  JsonLine& add(const std::string& key, const char* v) { return add(key, std::string(v)); }
  JsonLine& add(const std::string& key, double v);
  JsonLine& add(const std::string& key, int64_t v);
  JsonLine& add(const std::string& key, int v) { return add(key, int64_t(v)); }
  JsonLine& add(const std::string& key, bool v);
  JsonLine& add(const std::string& key, const JsonLine& object);                // a nested object
  JsonLine& add(const std::string& key, const std::vector<JsonLine>& objects);  // an array
  // An array of integer arrays (a matrix by rows).
  JsonLine& add(const std::string& key, const std::vector<std::vector<int64_t>>& rows);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void key(const std::string& k);
  std::string body_;
};

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Opens for appending (a resumed run continues the same file); empty path: disabled.
  explicit MetricsWriter(const std::string& path);
  MetricsWriter(MetricsWriter&& o) noexcept;
  MetricsWriter& operator=(MetricsWriter&& o) noexcept;
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  ~MetricsWriter();  // closes without throwing; close() reports what the close finds
  // Appends one line; a failed or short write throws (ErrorKind::runtime, exit 2) naming
  // the file and the system's error text.
  void write(const JsonLine& line);
  void close();  // throws like write() if the file system reports an error at close
  bool enabled() const { return fd_ >= 0; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace ringtrain::launch
