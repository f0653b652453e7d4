// TensorBoard event files written by ringtrain itself: TFRecord framing (length, masked
// CRC-32C of the length, data, masked CRC-32C of the data) around Event protocol buffers
// encoded by hand (the few fields TensorBoard reads: wall_time, step, file_version,
// summary.value{tag, simple_value | histo | tensor + plugin metadata}). Rank 0 owns the writer.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace ringtrain::launch {

uint32_t crc32c(const void* data, size_t n);  // Castagnoli, as TFRecord uses

class EventWriter {
 public:
  // Creates DIR (if needed) and DIR/events.out.tfevents.<seconds>.<host>.<pid>; input error if
  // it cannot.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  const std::string& path() const { return path_; }

  void scalar(const std::string& tag, int64_t step, double value);
  // A histogram of n fp32 values with TensorFlow's default exponential buckets.
  void histogram(const std::string& tag, int64_t step, const float* values, int64_t n);
  // Text (the text plugin: a string tensor), e.g. the run's configuration.
  void text(const std::string& tag, int64_t step, const std::string& markdown);
  // The run's hyper-parameters for TensorBoard's HParams tab (a session_start_info of the
  // hparams plugin); values are numbers when they read as one, else strings.
  void hparams(const std::vector<std::pair<std::string, std::string>>& values);
  // Each event is flushed as it is written; a failed write or flush (a full disk) throws
  // (ErrorKind::runtime, exit 2) naming the file and the system's error text.
  void flush();

 private:
  void write_event(const std::string& event);
  [[noreturn]] void fail(const char* doing);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace ringtrain::launch
