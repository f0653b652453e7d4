// StagedCommunicator (make_staged_communicator in nccl_api.hpp): MPI collectives on device
// buffers by way of host memory, for --comm mpi with --device cuda (no CUDA-aware MPI is
// assumed). Each collective copies the device range to a host buffer (the copy is ordered
// after the work queued on the device's compute stream), runs the inner collective, and
// copies the result back.
#include <vector>

#include "comm/nccl/nccl_api.hpp"
#include "comm/nccl/nccl_communicator.hpp"
#include "core/tensor.hpp"

namespace ringtrain::comm {
namespace {

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> inner, int device)
      : inner_(std::move(inner)), dev_{Device::cuda, device} {}
  const char* backend() const override { return inner_->backend(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int local_rank() const override { return inner_->local_rank(); }
  int local_size() const override { return inner_->local_size(); }
  int node() const override { return inner_->node(); }
  int num_nodes() const override { return inner_->num_nodes(); }

  void allreduce(void* buf, int64_t count, DType dtype, ReduceOp op) override {
    staged(buf, size_t(count) * dtype_size(dtype),
           [&](void* p) { inner_->allreduce(p, count, dtype, op); });
  }
  void broadcast(void* buf, int64_t count, DType dtype, int root) override {
    staged(buf, size_t(count) * dtype_size(dtype),
           [&](void* p) { inner_->broadcast(p, count, dtype, root); });
  }
  void allgather(const void* send, void* recv, int64_t count, DType dtype) override {
    if (!is_device_pointer(recv)) return inner_->allgather(send, recv, count, dtype);
    const size_t b = size_t(count) * dtype_size(dtype);
    std::vector<char> s(b), r(b * size_t(size()));
    copy_bytes(s.data(), Device{}, send, dev_, b);
    inner_->allgather(s.data(), r.data(), count, dtype);
    copy_bytes(recv, dev_, r.data(), Device{}, r.size());
  }
  void barrier() override { inner_->barrier(); }
  void reduce_scatter(void* buf, const std::vector<int64_t>& counts, DType dtype,
                      ReduceOp op) override {
    staged(buf, total(counts) * dtype_size(dtype),
           [&](void* p) { inner_->reduce_scatter(p, counts, dtype, op); });
  }
  void allgatherv(void* buf, const std::vector<int64_t>& counts, DType dtype) override {
    staged(buf, total(counts) * dtype_size(dtype),
           [&](void* p) { inner_->allgatherv(p, counts, dtype); });
  }
  MPI_Comm mpi() const override { return inner_->mpi(); }

 private:
  static size_t total(const std::vector<int64_t>& counts) {
    int64_t n = 0;
    for (int64_t c : counts) n += c;
    return size_t(n);
  }
  template <typename F>
  void staged(void* buf, size_t bytes, F run) {
    if (!is_device_pointer(buf)) return run(buf);
    host_.resize(bytes);
    copy_bytes(host_.data(), Device{}, buf, dev_, bytes);
    run(host_.data());
    copy_bytes(buf, dev_, host_.data(), Device{}, bytes);
  }

  std::unique_ptr<Communicator> inner_;
  Device dev_;
  std::vector<char> host_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> inner,
                                                       int device) {
  return std::make_unique<StagedCommunicator>(std::move(inner), device);
}

}  // namespace ringtrain::comm
