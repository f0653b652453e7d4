// ringtrain::Error and the check macros used by every library layer.
// Policy (style.md): library code throws; only launch/ catches, prints once, ends the job.
// ErrorKind decides the exit code: input errors (a bad option, file, shape or value the
// user can fix) exit 1, runtime failures exit 2.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace ringtrain {

enum class ErrorKind { input, runtime };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message)
      : std::runtime_error(std::move(message)), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  int exit_code() const { return kind_ == ErrorKind::input ? 1 : 2; }

 private:
  ErrorKind kind_;
};

// Concatenates anything streamable: cat("--batch-size ", n, " is not positive").
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

[[noreturn]] inline void throw_input(std::string message) {
  throw Error(ErrorKind::input, std::move(message));
}

// Runtime failures carry the source location: they are for whoever debugs the job.
[[noreturn]] inline void throw_runtime(const char* file, int line, std::string message) {
  throw Error(ErrorKind::runtime, cat(message, " (at ", file, ":", line, ")"));
}

}  // namespace ringtrain

// A user-fixable condition: the message must name the option/file/value and what is expected.
#define RT_REQUIRE(cond, ...)                                             \
  do {                                                                    \
    if (!(cond)) ::ringtrain::throw_input(::ringtrain::cat(__VA_ARGS__)); \
  } while (0)

// An internal invariant or a failed system call: a runtime error with file:line.
#define RT_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond))                                                                              \
      ::ringtrain::throw_runtime(__FILE__, __LINE__,                                          \
                                 ::ringtrain::cat("check failed: " #cond ": ", __VA_ARGS__)); \
  } while (0)
