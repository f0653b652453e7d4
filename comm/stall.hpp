// Stall detection: never a silent hang. A StallWatch thread watches this rank's waits in the
// gradient path's collectives; one that lasts longer than the timeout asks every other rank,
// over the control channel (comm/control.hpp: point-to-point, works on any transport), where
// it is, and ends the job with exit code 2 and a message naming the ranks that are behind
// or did not answer, and their hosts.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace ringtrain::comm {

class ControlChannel;

class StallWatch {
 public:
  // timeout_s <= 0 disables the watch. `channel` may be null (no process-wide channel, as in
  // unit tests): a stall then ends the job without asking the other ranks.
  StallWatch(ControlChannel* channel, double timeout_s);
  ~StallWatch();
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;
  // Around every wait in a collective of the gradient path. `position` orders the waits of
  // a step (the control channel compares ranks by it); `what` and `bucket` name the wait in
  // the message (bucket < 0: the position is the bucket).
  void enter(int64_t step, int64_t position, const char* what = "gradient allreduce",
             int64_t bucket = -1);
  void leave();

 private:
  void watch();
  ControlChannel* channel_;
  double timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool inside_ = false, stop_ = false;
  int64_t step_ = 0, position_ = 0, bucket_ = 0;
  const char* what_ = "";
  std::chrono::steady_clock::time_point since_;
  std::thread thread_;
};

}  // namespace ringtrain::comm
