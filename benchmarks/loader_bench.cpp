// loader_bench: is the data loader hidden behind compute? Times the same training steps
// (MLP forward, loss, backward, AdamW; one rank, one compute thread) three ways in one run:
//   memory    - the batches already in memory (the reference: no I/O at all)
//   prefetch  - the real Loader with its background thread reading N batches ahead
//   sync      - the real Loader reading each batch inside the step (--prefetch 0)
// and prints the step time of each and its ratio to the in-memory reference.
//   usage: loader_bench --data PATH [--steps N] [--batch N] [--prefetch N] [--json]
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "io/hdf5.hpp"
#include "io/loader.hpp"
#include "nn/graph_builder.hpp"
#include "nn/optimizer.hpp"

namespace {

using namespace ringtrain;
using Clock = std::chrono::steady_clock;

struct Bench {
  kernels::Backend& be;
  Model& model;
  Optimizer& opt;
  Buffer grad32;
  OwnedTensor dlogits;

  void step(const Tensor& x, const Tensor& y) {
    Context ctx{be, DType::f32, true};
    const Tensor& logits = model.forward(ctx, x);
    Tensor& dl = dlogits.ensure(logits.shape, DType::f32);
    be.softmax_xent(logits, y, 1.f, &dl);
    model.backward(ctx, dl);
    opt.step(be, model.master(), model.grad(), nullptr, 1e-3f);
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string data;
  int steps = 300, batch = 64, prefetch = 2;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--data")
      data = next();
    else if (a == "--steps")
      steps = std::stoi(next());
    else if (a == "--batch")
      batch = std::stoi(next());
    else if (a == "--prefetch")
      prefetch = std::stoi(next());
    else if (a == "--json")
      json = true;
    else {
      std::fprintf(
          stderr,
          "usage: loader_bench --data PATH [--steps N] [--batch N] [--prefetch N] [--json]\n");
      return a == "--help" ? 0 : 1;
    }
  }
  if (data.empty()) {
    std::fprintf(stderr, "loader_bench: --data is required\n");
    return 1;
  }
  try {
    io::silence_hdf5_errors();
    io::Dataset ds(data);
    const auto& info = ds.info();
    auto be = kernels::make_cpu_backend(1);
    auto model = build_model("mlp", info.sample_shape, info.num_classes, {{"hidden", "512,256"}},
                             DType::f32);
    model->init_parameters(1, *be);
    auto opt = make_optimizer(OptimizerConfig{}, model->num_params());
    Bench b{*be, *model, *opt, {}, {}};

    // Reference: the same batches, read beforehand.
    std::vector<OwnedTensor> xs(static_cast<size_t>(steps)), ys(static_cast<size_t>(steps));
    {
      io::Loader pre(ds, 7, batch, 0, 1, io::normalization_of(info), 0);
      for (int s = 0; s < steps; ++s) {
        const io::Batch& bt = pre.next();
        b.be.cast(bt.x, xs[size_t(s)].ensure(bt.x.shape, DType::f32));
        b.be.cast(bt.y, ys[size_t(s)].ensure(bt.y.shape, DType::i32));
      }
    }
    auto time_steps = [&](auto get) {
      for (int s = 0; s < 10; ++s) get(s);  // warm-up outside the timing: not counted
      const auto t0 = Clock::now();
      for (int s = 0; s < steps; ++s) get(s);
      return std::chrono::duration<double>(Clock::now() - t0).count() / steps;
    };
    const double mem = time_steps([&](int s) { b.step(xs[size_t(s)].view, ys[size_t(s)].view); });
    auto with_loader = [&](int depth) {
      io::Loader loader(ds, 7, batch, 0, 1, io::normalization_of(info), depth);
      return time_steps([&](int) {
        const io::Batch& bt = loader.next();
        b.step(bt.x, bt.y);
      });
    };
    const double pre = with_loader(prefetch), sync = with_loader(0);
    if (json) {
      std::printf(
          "{\"data\":\"%s\",\"batch\":%d,\"steps\":%d,\"memory_ms\":%.4f,\"prefetch\":%d,"
          "\"prefetch_ms\":%.4f,\"sync_ms\":%.4f,\"prefetch_ratio\":%.4f,\"sync_ratio\":%.4f}\n",
          data.c_str(), batch, steps, mem * 1e3, prefetch, pre * 1e3, sync * 1e3, pre / mem,
          sync / mem);
    } else {
      std::printf("# step time of the MLP (batch %d, 1 rank, 1 compute thread), %d steps each\n",
                  batch, steps);
      std::printf("%-22s %10s %8s\n", "data source", "ms/step", "ratio");
      std::printf("%-22s %10.3f %8.3f\n", "in memory (reference)", mem * 1e3, 1.0);
      std::printf("%-22s %10.3f %8.3f\n", ("loader, prefetch " + std::to_string(prefetch)).c_str(),
                  pre * 1e3, pre / mem);
      std::printf("%-22s %10.3f %8.3f\n", "loader, prefetch 0", sync * 1e3, sync / mem);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loader_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
