// loader_bench: is the data loader hidden behind compute? Times the same training steps
// (MLP forward, loss, backward, AdamW; one rank, one compute thread) three ways:
//   memory    - the batches already in memory (the reference: no I/O at all)
//   prefetch  - the real Loader with its background thread reading N batches ahead
//   sync      - the real Loader reading each batch inside the step (--prefetch 0)
// and, as the bound, the loader alone (reads, no step): what prefetch has to hide. The
// modes alternate in --rounds rounds, so a slow spell of a shared machine hits each alike;
// the table prints the median of the rounds and their range, and ratios to the in-memory
// median.
//   usage: loader_bench --data PATH [--steps N] [--batch N] [--prefetch N] [--rounds N] [--json]
#include <algorithm>
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
  int steps = 300, batch = 64, prefetch = 2, rounds = 3;
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
    else if (a == "--rounds")
      rounds = std::stoi(next());
    else if (a == "--json")
      json = true;
    else {
      std::fprintf(
          stderr,
          "usage: loader_bench --data PATH [--steps N] [--batch N] [--prefetch N] [--rounds N] "
          "[--json]\n");
      return a == "--help" ? 0 : 1;
    }
  }
  if (data.empty()) {
    std::fprintf(stderr, "loader_bench: --data is required\n");
    return 1;
  }
  if (steps < 1 || batch < 1 || prefetch < 0 || rounds < 1) {
    std::fprintf(stderr,
                 "loader_bench: --steps, --batch and --rounds must be >= 1 and --prefetch >= 0\n");
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
    auto with_loader = [&](int depth) {
      io::Loader loader(ds, 7, batch, 0, 1, io::normalization_of(info), depth);
      return time_steps([&](int) {
        const io::Batch& bt = loader.next();
        b.step(bt.x, bt.y);
      });
    };
    auto read_only = [&] {
      io::Loader loader(ds, 7, batch, 0, 1, io::normalization_of(info), 0);
      return time_steps([&](int) { loader.next(); });
    };
    // Rounds of all four, alternating; per mode the median and range over the rounds.
    std::vector<double> mem, pre, sync, read;
    for (int r = 0; r < rounds; ++r) {
      mem.push_back(time_steps([&](int s) { b.step(xs[size_t(s)].view, ys[size_t(s)].view); }));
      pre.push_back(with_loader(prefetch));
      sync.push_back(with_loader(0));
      read.push_back(read_only());
    }
    struct Stat {
      double med, lo, hi;
    };
    auto stat = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return Stat{v[v.size() / 2], v.front(), v.back()};
    };
    const Stat m = stat(mem), p = stat(pre), sy = stat(sync), rd = stat(read);
    if (json) {
      std::printf(
          "{\"data\":\"%s\",\"batch\":%d,\"steps\":%d,\"rounds\":%d,\"memory_ms\":%.4f,"
          "\"prefetch\":%d,\"prefetch_ms\":%.4f,\"sync_ms\":%.4f,\"read_only_ms\":%.4f,"
          "\"prefetch_ratio\":%.4f,\"sync_ratio\":%.4f,\"read_only_ratio\":%.4f}\n",
          data.c_str(), batch, steps, rounds, m.med * 1e3, prefetch, p.med * 1e3, sy.med * 1e3,
          rd.med * 1e3, p.med / m.med, sy.med / m.med, rd.med / m.med);
    } else {
      std::printf(
          "# step time of the MLP (batch %d, 1 rank, 1 compute thread), %d steps each, median of "
          "%d rounds\n",
          batch, steps, rounds);
      std::printf("%-24s %10s %8s %18s\n", "data source", "ms/step", "ratio", "range (ms)");
      auto row = [&](const std::string& name, const Stat& s) {
        std::printf("%-24s %10.3f %8.3f %8.3f-%-8.3f\n", name.c_str(), s.med * 1e3, s.med / m.med,
                    s.lo * 1e3, s.hi * 1e3);
      };
      row("in memory (reference)", m);
      row("loader, prefetch " + std::to_string(prefetch), p);
      row("loader, prefetch 0", sy);
      row("loader alone (no step)", rd);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loader_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
