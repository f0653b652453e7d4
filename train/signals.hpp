// SIGUSR1, SIGTERM and SIGINT ask the job to stop: the handler only sets a flag; the
// trainer agrees on it across ranks at the next step boundary, saves and exits 75.
#pragma once

#include <string>

namespace ringtrain::launch {

void install_stop_handlers();
bool stop_requested();
int stop_signal();  // the signal received, 0 if none
// "SIGTERM", "SIGUSR1", "SIGINT"; "signal N" for others.
std::string signal_name(int sig);

}  // namespace ringtrain::launch
