// The GPU communicators of a build without CUDA: clear input errors (see nccl_api.hpp).
#include "comm/nccl/nccl_api.hpp"
#include "core/error.hpp"

namespace ringtrain::comm {
namespace {
[[noreturn]] void not_built(const char* what) {
  throw_input(cat(what,
                  ": this build of ringtrain has no CUDA/NCCL support (configure with "
                  "-DRINGTRAIN_CUDA=ON); use --comm mpi or hierarchical with --device cpu"));
}
}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, int) { not_built("--comm nccl"); }
std::unique_ptr<Communicator> make_nccl_hierarchical(MPI_Comm, int) {
  not_built("--comm hierarchical on cuda");
}
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator>, int) {
  not_built("--device cuda");
}
std::string nccl_version() { return "not built"; }

}  // namespace ringtrain::comm
