// SIGUSR1, SIGTERM and SIGINT ask the job to stop: a flag is set; the trainer agrees on it
// across ranks at the next step boundary, saves and exits 75. SIGUSR2 asks every rank that
// gets it for its flight-recorder dump: a byte is written to a pipe, which the recorder's
// dump thread reads (comm/flight_recorder.hpp). The first install_* call blocks the four
// signals in the calling thread (and so in every thread started after it) and starts one
// thread that takes them with sigwait(): call it first in main, before MPI starts threads.
#pragma once

#include <string>

namespace ringtrain::launch {

void install_stop_handlers();
bool stop_requested();
// Installs the SIGUSR2 handler (once); returns the read end of its pipe.
int install_dump_handler();
int stop_signal();  // the signal received, 0 if none
// "SIGTERM", "SIGUSR1", "SIGINT"; "signal N" for others.
std::string signal_name(int sig);

}  // namespace ringtrain::launch
