// Async-signal-safe stop flag (see signals.hpp).
#include "train/signals.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <initializer_list>

namespace ringtrain::launch {
namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop(int sig) { g_signal = sig; }
int g_dump_pipe[2] = {-1, -1};
extern "C" void on_dump(int) {
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = write(g_dump_pipe[1], &byte, 1);  // non-blocking
}
}  // namespace

int install_dump_handler() {
  if (g_dump_pipe[0] >= 0) return g_dump_pipe[0];
  if (pipe(g_dump_pipe) != 0) return -1;
  for (int fd : g_dump_pipe) fcntl(fd, F_SETFD, FD_CLOEXEC);
  fcntl(g_dump_pipe[1], F_SETFL, O_NONBLOCK);
  struct sigaction sa = {};
  sa.sa_handler = on_dump;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &sa, nullptr);
  return g_dump_pipe[0];
}

void install_stop_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = on_stop;
  // Blocking calls in the libraries every thread is in (MPI's progress, HDF5, the loader's
  // reads, OpenMP's waits) restart after the handler instead of failing with EINTR.
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGUSR1, SIGTERM, SIGINT}) sigaction(sig, &sa, nullptr);
}

bool stop_requested() { return g_signal != 0; }
int stop_signal() { return g_signal; }

std::string signal_name(int sig) {
  switch (sig) {
    case SIGUSR1:
      return "SIGUSR1";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR2:
      return "SIGUSR2";
    default:
      return "signal " + std::to_string(sig);
  }
}

}  // namespace ringtrain::launch
