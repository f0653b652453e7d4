// The recording communicator (see recording_communicator.hpp).
#include "comm/recording_communicator.hpp"

#include <numeric>

namespace ringtrain::comm {

template <typename Fn>
void RecordingCommunicator::recorded(const char* kind, int64_t count, DType dtype, Fn&& fn) {
  const uint64_t id = rec_.begin(kind, inner_.backend(), ++seq_, count, dtype);
  fn();
  rec_.end(id);
}

void RecordingCommunicator::allreduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
  recorded("allreduce", count, dtype, [&] { inner_.allreduce(buf, count, dtype, op); });
}

void RecordingCommunicator::broadcast(void* buf, int64_t count, DType dtype, int root) {
  recorded("broadcast", count, dtype, [&] { inner_.broadcast(buf, count, dtype, root); });
}

void RecordingCommunicator::allgather(const void* send, void* recv, int64_t count, DType dtype) {
  recorded("allgather", count, dtype, [&] { inner_.allgather(send, recv, count, dtype); });
}

void RecordingCommunicator::barrier() {
  recorded("barrier", 0, DType::u8, [&] { inner_.barrier(); });
}

void RecordingCommunicator::reduce_scatter(void* buf, const std::vector<int64_t>& counts,
                                           DType dtype, ReduceOp op) {
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  recorded("reduce_scatter", total, dtype, [&] { inner_.reduce_scatter(buf, counts, dtype, op); });
}

void RecordingCommunicator::allgatherv(void* buf, const std::vector<int64_t>& counts, DType dtype) {
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  recorded("allgatherv", total, dtype, [&] { inner_.allgatherv(buf, counts, dtype); });
}

}  // namespace ringtrain::comm
