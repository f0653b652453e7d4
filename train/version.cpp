// `ringtrain --version`: this build and the versions of every library built in.
#include <H5public.h>
#include <onnx/common/version.h>
#include <boost/version.hpp>

#include "comm/mpi/mpi_communicator.hpp"
#include "core/error.hpp"
#include "kernels/cuda/cuda_api.hpp"
#include "kernels/kernels.hpp"
#include "ringtrain/config.hpp"
#include "train/version.hpp"

namespace ringtrain::launch {

std::string version_text() {
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  return cat(
      "ringtrain ", RINGTRAIN_VERSION, " (", RINGTRAIN_BUILD_TYPE, ")\n",
      "  MPI:    ", comm::mpi_library_version(), "\n", "  HDF5:   ", maj, ".", min, ".", rel,
      H5_HAVE_PARALLEL ? " (parallel)" : " (serial)", "\n", "  BLAS:   ", kernels::blas_version(),
      "\n", "  CPU:    ", kernels::describe_cpu_gemm(), "\n", "  Boost:  ", BOOST_VERSION / 100000,
      ".", BOOST_VERSION / 100 % 1000, "\n", "  ONNX:   ", onnx::LAST_RELEASE_VERSION,
      " (libonnx, for export)\n", "  SentencePiece: ", RINGTRAIN_SENTENCEPIECE_VERSION,
      " (tokenizers, through librt_sentencepiece.so)\n", "  CUDA:   ",
      RINGTRAIN_HAS_CUDA
          ? cat("built for sm ", RINGTRAIN_CUDA_ARCHS, " with toolkit ", RINGTRAIN_CUDA_VERSION,
                "\n          loaded: ", kernels::cuda::library_versions(),
                "\n  cuDNN:  ", RINGTRAIN_CUDNN_VERSION, "\n  NCCL:   ", RINGTRAIN_NCCL_VERSION)
          : std::string("not built\n  cuDNN:  not built\n  NCCL:   not built"),
      "\n");
}

}  // namespace ringtrain::launch
