// Checkpoints for tests/e2e/onnx.sh that `ringtrain train` cannot write (yet):
//   onnx_fixture gpt DIR     a 2-block gpt-tiny (width 64, 4 heads, context 32) with
//                            parameters drawn from U(-0.3, 0.3) (larger than GPT-2's init,
//                            so that the logits and the attention pattern are far from
//                            uniform), saved as DIR/ckpt-000000001.h5 with the checkpoint
//                            writer; 4 sequences of 24 random token ids (DIR/tokens.npy, as
//                            float32) and ringtrain's fp32 forward logits [4, 24, 256] on
//                            them (DIR/logits.npy)
//   onnx_fixture gpt2 DIR    the same for gpt2-124m at its full size (vocabulary 50257,
//                            logits [4, 24, 50304]) and GPT-2's initialisation: run by
//                            hand, too large for the e2e test
//   onnx_fixture llama DIR   as gpt for a 2-layer llama-tiny (width 64, 4 heads, 2 kv heads,
//                            ffn 96, context 32): rotary embeddings, grouped-query attention,
//                            RMS norms, SwiGLU, an untied head
//   onnx_fixture plugin DIR  a model with a plugin op (`custom { type: "test_identity" }`,
//                            registered here as a plugin would) in DIR/ckpt-000000001.h5
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "io/checkpoint.hpp"
#include "io/npy.hpp"
#include "kernels/kernels.hpp"
#include "nn/graph_builder.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/config.hpp"

namespace {

using namespace ringtrain;

// y = x: an op only a plugin knows (what export must refuse by name).
class TestIdentity final : public Layer {
 public:
  using Layer::Layer;
  const Tensor& forward(Context&, const Tensor& x) override { return y_ = x; }
  const Tensor& backward(Context&, const Tensor& dy) override { return dx_ = dy; }

 private:
  Tensor y_, dx_;
};

RINGTRAIN_REGISTER_OP(test_identity, OpDef{.name = "test_identity",
                                           .infer = [](const OpNode& n) { return n.inputs[0]; },
                                           .build = [](const OpNode& n) -> std::unique_ptr<Layer> {
                                             return std::make_unique<TestIdentity>(n.name);
                                           },
                                           .flops = nullptr});

void save(Model& model, const std::string& dir) {
  io::CheckpointMeta m;
  m.step = 1;
  m.global_batch = 1;
  m.precision = "fp32";
  m.model = model.text();
  m.ringtrain_version = RINGTRAIN_VERSION;
  m.optimizer = "sgd";
  std::vector<io::NamedTensor> params, buffers;
  for (Param& p : model.params()) params.emplace_back(p.name, p.master);
  for (StateBuffer& b : model.buffers()) buffers.emplace_back(b.name, b.value);
  io::CheckpointStore store(dir, 1);
  store.save(MPI_COMM_NULL, m, params, {}, {}, buffers);
}

int gpt(const std::string& dir, kernels::Backend& backend, bool gpt2, bool llama = false) {
  const int64_t batch = 4, t = 24, vocab = gpt2 ? 50257 : 256;
  auto model =
      gpt2    ? build_model("gpt2-124m", {t}, vocab, {}, DType::f32)
      : llama ? build_model("llama-tiny", {t}, vocab,
                            {{"layers", "2"},
                             {"width", "64"},
                             {"heads", "4"},
                             {"kv_heads", "2"},
                             {"ffn", "96"},
                             {"context", "32"}},
                            DType::f32)
              : build_model("gpt-tiny", {t}, vocab,
                            {{"layers", "2"}, {"width", "64"}, {"heads", "4"}, {"context", "32"}},
                            DType::f32);
  model->init_parameters(7, backend);
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> u(-0.3f, 0.3f);
  Tensor masters = model->master();
  if (!gpt2)  // gpt2-124m keeps GPT-2's initialisation: the magnitudes of a real model's
    for (int64_t i = 0; i < masters.numel(); ++i) masters.as<float>()[i] = u(gen);
  model->refresh_working_copy(backend);
  save(*model, dir);

  std::uniform_int_distribution<int32_t> tok(0, int32_t(vocab) - 1);
  OwnedTensor ids;
  Tensor& x = ids.ensure({batch, t}, DType::i32, Device{});
  std::vector<float> ids_f(size_t(batch * t));
  for (int64_t i = 0; i < batch * t; ++i) ids_f[size_t(i)] = float(x.as<int32_t>()[i] = tok(gen));
  Context ctx{backend, DType::f32, /*training=*/false};
  const Tensor& logits = model->forward(ctx, x);
  io::write_npy_f32(dir + "/tokens.npy", ids_f.data(), {batch, t});
  io::write_npy_f32(dir + "/logits.npy", logits.as<float>(), logits.shape);
  return 0;
}

int plugin(const std::string& dir, kernels::Backend& backend) {
  const std::string file = dir + "/with_plugin_op.pbtxt";
  std::ofstream(file) << "format_version: 1\nname: \"with_plugin_op\"\n"
                         "node { name: \"fc1\" linear { out_features: 8 activation: RELU } }\n"
                         "node { name: \"same\" custom { type: \"test_identity\" } }\n"
                         "node { name: \"fc2\" linear { out_features: 3 } }\n";
  auto model = build_model(file, {4}, 3, {}, DType::f32);
  model->init_parameters(3, backend);
  save(*model, dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 1;
  const std::string what = argc == 3 ? argv[1] : "";
  try {
    auto backend = kernels::make_cpu_backend(1);
    if (argc == 3) std::filesystem::create_directories(argv[2]);
    if (what == "gpt" || what == "gpt2") rc = gpt(argv[2], *backend, what == "gpt2");
    if (what == "llama") rc = gpt(argv[2], *backend, false, true);
    if (what == "plugin") rc = plugin(argv[2], *backend);
    if (what != "gpt" && what != "gpt2" && what != "llama" && what != "plugin")
      std::fprintf(stderr, "usage: onnx_fixture gpt|gpt2|llama|plugin DIR\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "onnx_fixture: %s\n", e.what());
    rc = 2;
  }
  MPI_Finalize();
  return rc;
}
