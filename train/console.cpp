// Rank 0's progress, announcements and warnings (see console.hpp).
#include "train/console.hpp"

#include <iostream>

#include "core/error.hpp"

namespace ringtrain::launch {

void Console::say(const std::string& line) {
  if (quiet_) return;
  if (bar_active_) std::cout << '\n';  // keep the progress bar's last state on its line
  bar_active_ = false;
  std::cout << line << std::endl;
}

void Console::warn(const char* kind, const std::string& message) {
  if (quiet_) return;
  if (bar_active_) std::cout << std::endl;  // the bar's line ends before the message
  bar_active_ = false;
  std::cerr << cat("ringtrain: ", kind, ": ", message, "\n") << std::flush;  // one write
}

void Console::progress(const std::string& line, double fraction) {
  if (quiet_) return;
  if (!bar_) return say(line);  // batch jobs and files: plain lines
  constexpr int kWidth = 20;
  const int filled = int(fraction * kWidth + 0.5);
  std::cout << "\r[" << std::string(size_t(filled), '#')
            << std::string(size_t(kWidth - filled), '.') << "] " << line << "\033[K" << std::flush;
  bar_active_ = true;
}

void Console::end_bar() {
  if (bar_active_) std::cout << std::endl;
  bar_active_ = false;
}

}  // namespace ringtrain::launch
