// Console: rank 0's lines for the person watching a run -- progress on stdout (a bar redrawn
// in place on a terminal, plain lines otherwise), announcements, and warnings on stderr --
// keeping the bar's last state on its own line whenever something else is printed. Other
// ranks print nothing through it.
#pragma once

#include <string>

namespace ringtrain::launch {

class Console {
 public:
  Console() = default;
  Console(int rank, bool bar) : quiet_(rank != 0), bar_(bar) {}
  void say(const std::string& line);                        // stdout, a line of its own
  void warn(const char* kind, const std::string& message);  // stderr: "ringtrain: KIND: ..."
  // A progress line; with a bar, `fraction` of the run is shown done.
  void progress(const std::string& line, double fraction);
  void end_bar();  // ends the bar's line (at the end of a run)
  // A bar is drawn (rank 0 on a terminal): worth redrawing between --log-every lines.
  bool live() const { return !quiet_ && bar_; }

 private:
  bool quiet_ = true, bar_ = false, bar_active_ = false;
};

}  // namespace ringtrain::launch
