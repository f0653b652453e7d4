// The metrics file: JSON lines written by rank 0, one object per event with a "type"
// (step, eval, skip, checkpoint, warning), flushed per line so a crash loses nothing written.
#pragma once

#include <fstream>
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
  // A value that is already JSON text (an array or object built by the caller).
  JsonLine& add_json(const std::string& key, const std::string& json);
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
  void write(const JsonLine& line);
  bool enabled() const { return out_.is_open(); }

 private:
  std::ofstream out_;
};

}  // namespace ringtrain::launch
