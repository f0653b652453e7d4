// For tests/e2e/hf.sh: ringtrain's fp32 forward logits of a checkpoint's language model on
// given token ids, the figure compared with transformers' (ringtrain `predict` takes no token
// data yet).
//   hf_logits CKPT TOKENS.npy OUT.npy   TOKENS: int32 or int64 [B, T]; OUT: float32 [B, T, V]
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "io/npy.hpp"
#include "train/device.hpp"
#include "train/model_source.hpp"

int main(int argc, char** argv) {
  using namespace ringtrain;
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    if (argc != 4) {
      std::fprintf(stderr, "usage: hf_logits CKPT TOKENS.npy OUT.npy\n");
      rc = 1;
    } else {
      auto backend = kernels::make_cpu_backend(1);
      launch::LoadedModel m =
          launch::load_model_from_checkpoint(argv[1], DType::f32, Device{}, *backend);
      const io::NpyArray ids = io::read_npy(argv[2]);
      const Shape& s = ids.header.shape;
      if (s.size() != 2) throw Error(ErrorKind::input, "TOKENS must be [B, T]");
      OwnedTensor x;
      Tensor& t = x.ensure(s, DType::i32, Device{});
      for (int64_t i = 0; i < ids.count(); ++i) {
        int64_t v = 0;
        if (ids.header.type == io::NpyType::i8) {
          std::memcpy(&v, ids.data.data() + 8 * i, 8);
        } else {
          int32_t w;
          std::memcpy(&w, ids.data.data() + 4 * i, 4);
          v = w;
        }
        t.as<int32_t>()[i] = int32_t(v);
      }
      Context ctx{*backend, DType::f32, /*training=*/false};
      const Tensor& logits = m.model->forward(ctx, t);
      io::write_npy_f32(argv[3], logits.as<float>(), logits.shape);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_logits: %s\n", e.what());
    rc = 2;
  }
  MPI_Finalize();
  return rc;
}
