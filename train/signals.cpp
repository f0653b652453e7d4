// Async-signal-safe stop flag (see signals.hpp).
#include "train/signals.hpp"

#include <csignal>
#include <initializer_list>

namespace ringtrain::launch {
namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop(int sig) { g_signal = sig; }
}  // namespace

void install_stop_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = on_stop;
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
    default:
      return "signal " + std::to_string(sig);
  }
}

}  // namespace ringtrain::launch
