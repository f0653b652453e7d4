// SIGUSR1, SIGTERM and SIGINT ask the job to stop: the handler only sets a flag; the
// trainer agrees on it across ranks at the next step boundary, saves and exits 75.
#pragma once

namespace ringtrain::launch {

void install_stop_handlers();
bool stop_requested();
int stop_signal();  // the signal received, 0 if none

}  // namespace ringtrain::launch
