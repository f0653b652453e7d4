// Stop and dump signals, delivered to one thread (see signals.hpp).
#include "train/signals.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <initializer_list>
#include <mutex>
#include <thread>

namespace ringtrain::launch {
namespace {

std::atomic<int> g_signal{0};
int g_dump_pipe[2] = {-1, -1};
std::once_flag g_started;

// What either receiver does with a signal: a stop signal sets the flag, SIGUSR2 writes a
// byte to the dump pipe (non-blocking). Both are async-signal-safe.
void take(int sig) {
  if (sig == SIGUSR2) {
    const char byte = 1;
    if (g_dump_pipe[1] >= 0) {
      [[maybe_unused]] const ssize_t n = write(g_dump_pipe[1], &byte, 1);
    }
  } else {
    g_signal.store(sig);
  }
}
extern "C" void on_signal(int sig) { take(sig); }

void start() {
  if (pipe(g_dump_pipe) == 0) {
    for (int fd : g_dump_pipe) fcntl(fd, F_SETFD, FD_CLOEXEC);
    fcntl(g_dump_pipe[1], F_SETFL, O_NONBLOCK);
  } else {
    g_dump_pipe[0] = g_dump_pipe[1] = -1;
  }
  // The handler for a thread that was started before this one blocked the signals (a
  // library's, from a constructor that ran before main): blocking calls restart after it.
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGUSR1, SIGTERM, SIGINT, SIGUSR2}) {
    sigaction(sig, &sa, nullptr);
    sigaddset(&set, sig);
  }
  // Blocked here, and so in every thread started from now on (MPI's, OpenMP's, the
  // trainer's): the kernel delivers these signals to the one thread that waits for them, and
  // never interrupts a thread that computes, communicates or reads (a signal landing in
  // oneDNN's kernels or a library's system call mid-step is a hazard no handler can undo).
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) == 0) take(sig);
    }
  }).detach();
}

}  // namespace

int install_dump_handler() {
  std::call_once(g_started, start);
  return g_dump_pipe[0];
}

void install_stop_handlers() { std::call_once(g_started, start); }

bool stop_requested() { return g_signal.load() != 0; }
int stop_signal() { return g_signal.load(); }

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
