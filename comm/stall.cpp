// StallWatch (see stall.hpp).
#include "comm/stall.hpp"

#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "comm/control.hpp"
#include "comm/flight_recorder.hpp"
#include "core/error.hpp"

namespace ringtrain::comm {

// How long a stalled rank waits for the others to say where they are.
constexpr double kAnswerSeconds = 5;

StallWatch::StallWatch(ControlChannel* channel, double timeout_s)
    : channel_(channel), timeout_s_(timeout_s) {
  if (timeout_s_ > 0) thread_ = std::thread([this] { watch(); });
}

StallWatch::~StallWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StallWatch::enter(int64_t step, int64_t position, const char* what, int64_t bucket) {
  if (channel_) channel_->arrive(step, position);
  std::lock_guard<std::mutex> lock(mu_);
  inside_ = true;
  step_ = step;
  position_ = position;
  bucket_ = bucket < 0 ? position : bucket;
  what_ = what;
  since_ = std::chrono::steady_clock::now();
  cv_.notify_all();
}

void StallWatch::leave() {
  std::lock_guard<std::mutex> lock(mu_);
  inside_ = false;
}

void StallWatch::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(200));
    if (!inside_) continue;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
    if (waited < timeout_s_) continue;
    // A rank that failed is ending the job; its message is the one that counts.
    if (channel_ && channel_->failure_elsewhere()) continue;
    const int64_t step = step_, position = position_, bucket = bucket_;
    const char* what = what_;
    lock.unlock();
    const std::string behind = channel_ ? channel_->behind(step, position, kAnswerSeconds) : "";
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    const std::string message =
        cat("stall: rank ", rank, " on ", host, " has waited ", int64_t(waited),
            " s (--stall-timeout) in the ", what, " of step ", step, " bucket ", bucket,
            "; not arrived: ",
            behind.empty() ? (channel_ ? "(none behind: a network or MPI problem)"
                                       : "(the other ranks could not be asked)")
                           : behind);
    const FlightRecorder* rec = FlightRecorder::instance();
    const std::string dumps =
        rec && !rec->dir().empty()
            ? cat("; flight recorders in ", rec->dir(), " (ringtrain analyze ", rec->dir(), ")")
            : std::string();
    if (channel_) channel_->fail(2, message + dumps);
    if (FlightRecorder* own = FlightRecorder::instance()) own->dump_final(message);
    std::fprintf(stderr, "ringtrain: error: %s%s\n", message.c_str(), dumps.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
    std::_Exit(2);
  }
}

}  // namespace ringtrain::comm
