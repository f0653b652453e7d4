// zero_bench: what ZeRO-1 (--zero 1) saves and what it sends, per rank.
//  1. Memory: bytes per rank of fp32 masters, AdamW state, working weights (with the full
//     fp32 copy of the parameters read in fp32: biases and LayerNorm) and gradients for
//     W = 1..4, for the GPT-2 124M shape; the optimizer state is measured as the bytes the
//     real optimizer allocates for its shard. --zero 1 holds the masters' shard only (in
//     fp32 the shard is part of the all-gathered working weights, so it is counted there).
//  2. Wire: bytes each rank sends per step under the ring model (allreduce 2(W-1)/W x bytes;
//     reduce-scatter and all-gather (W-1)/W x bytes each, the all-gather in the working
//     dtype, plus the fp32-read parameters) for --zero 0 and 1.
//  3. Time (under mpirun -n W): the allreduce of the gradient against reduce-scatter +
//     all-gather over the shard layout, the same buffer, measured in the same run (ratio).
//  4. With --train DATA: training step time of --zero S (--stage S: 1, the default, or 2)
//     against --zero 0 in one run: two
//     Trainers of the same model (--model, AdamW, --threads 1) side by side, blocks of 10
//     steps alternated after a warm-up, so that the machine's load affects both alike; fp32
//     and bf16; the ratio of the mean step times (and of the median blocks').
// Usage: mpirun -n W zero_bench [--params N] [--precision fp32|bf16] [--iters K]
//                               [--train DATA [--model NAME] [--steps K] [--batch G]
//                               [--stage 1|2]]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.hpp"
#include "comm/shard_layout.hpp"
#include "nn/optimizer.hpp"
#include "train/trainer.hpp"

namespace {

using ringtrain::DType;

// GPT-2 small (12 layers, 768 wide, 1024 positions): parameters from the shapes.
int64_t gpt2_params(int64_t vocab) {
  const int64_t d = 768, l = 12, ctx = 1024;
  const int64_t per_layer =
      2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d);
  return vocab * d + ctx * d + l * per_layer + 2 * d;
}
// Its parameters read in fp32 (ParamSpec::reads_fp32): LayerNorm gains and shifts, biases.
int64_t gpt2_fp32_read() {
  const int64_t d = 768, l = 12;
  return l * (2 * d + 3 * d + d + 2 * d + 4 * d + d) + 2 * d;
}

struct Row {
  int64_t masters, optimizer, work, grads;
};

Row memory(int64_t p, int64_t fp32_read, int w, bool zero, int rank, DType precision) {
  const ringtrain::comm::ShardLayout s(p, zero ? w : 1);
  ringtrain::OptimizerConfig oc;                                  // adamw
  const auto opt = ringtrain::make_optimizer(oc, s.count(rank));  // allocates the shard's state
  const int64_t es = int64_t(ringtrain::dtype_size(precision));
  const bool mixed = precision != DType::f32;
  const int64_t masters = s.count(rank) * 4;
  const int64_t work = mixed ? p * es + (zero ? fp32_read * 4 : 0) : p * 4 - masters;
  return {masters, opt->state_bytes(), work, p * es + (mixed ? s.count(rank) * 4 : 0)};
}

void print_memory(const char* name, int64_t p, int64_t fp32_read, DType precision) {
  std::printf("\n# memory per rank (rank 0's shard), %s, %lld parameters, %s, AdamW\n", name,
              static_cast<long long>(p), ringtrain::dtype_name(precision));
  std::printf("%-4s %-6s %14s %14s %14s %14s %14s %12s\n", "W", "zero", "masters", "optimizer",
              "working", "gradients", "total", "(m+opt)/P");
  for (int w = 1; w <= 4; ++w)
    for (int zero = 0; zero <= 1; ++zero) {
      const Row r = memory(p, fp32_read, w, zero, 0, precision);
      std::printf("%-4d %-6d %14lld %14lld %14lld %14lld %14lld %12.3f\n", w, zero,
                  static_cast<long long>(r.masters), static_cast<long long>(r.optimizer),
                  static_cast<long long>(r.work), static_cast<long long>(r.grads),
                  static_cast<long long>(r.masters + r.optimizer + r.work + r.grads),
                  double(r.masters + r.optimizer) / double(p));
    }
}

// Part 4: seconds per step of --zero 0 and --zero `stage`, alternated; rank 0 prints the row.
void time_training(ringtrain::comm::Communicator& c0, ringtrain::comm::Communicator& c1,
                   const std::string& data, const std::string& model, DType precision,
                   int64_t steps, int64_t batch, int stage) {
  constexpr int64_t kBlock = 10;
  steps = std::max<int64_t>(kBlock, steps / kBlock * kBlock);  // whole blocks
  ringtrain::launch::TrainConfig cfg;
  cfg.data = data;
  cfg.model = model;
  cfg.precision = precision;
  cfg.steps = steps + 5;
  cfg.threads = 1;
  cfg.global_batch_size = batch;
  cfg.resume = "never";
  ringtrain::launch::Trainer plain(cfg, c0);
  cfg.zero = stage;
  ringtrain::launch::Trainer zero(cfg, c1);
  for (int i = 0; i < 5; ++i) {  // warm-up: first-touch pages, oneDNN primitives
    plain.step_once();
    zero.step_once();
    zero.finish_weight_gather();
  }
  // Blocks of kBlock steps, alternated, each timed whole: a sharded step leaves its
  // all-gather to the next step's forward, so a block ends with finish_weight_gather() (its
  // last all-gather exposed, once per block) and a block's steps count together.
  std::vector<double> t0, t1;  // seconds per step, one entry per block
  auto block = [&](ringtrain::launch::Trainer& t) {
    const auto begin = std::chrono::steady_clock::now();
    for (int64_t k = 0; k < kBlock; ++k) t.step_once();
    t.finish_weight_gather();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count() /
           double(kBlock);
  };
  for (int64_t i = 0; i < steps / kBlock; ++i) {  // alternate which goes first
    auto& first = i % 2 ? zero : plain;
    auto& second = i % 2 ? plain : zero;
    const double a = block(first), b = block(second);
    (i % 2 ? t1 : t0).push_back(a);
    (i % 2 ? t0 : t1).push_back(b);
  }
  double s0 = 0, s1 = 0;
  for (double v : t0) s0 += v / double(t0.size());
  for (double v : t1) s1 += v / double(t1.size());
  std::sort(t0.begin(), t0.end());
  std::sort(t1.begin(), t1.end());
  const double m0 = t0[t0.size() / 2], m1 = t1[t1.size() / 2];
  if (c0.rank() == 0)
    std::printf("%-6s %-6s %6lld %12.3f %12.3f %8.3f %12.3f %12.3f %8.3f\n", model.c_str(),
                ringtrain::dtype_name(precision), static_cast<long long>(steps), s0 * 1e3, s1 * 1e3,
                s1 / s0, m0 * 1e3, m1 * 1e3, m1 / m0);
}

}  // namespace

int main(int argc, char** argv) {
  int level = 0;
  ringtrain::comm::prefer_yielding_mpi_waits();  // as `ringtrain train` does
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
  int64_t params = 0, train_steps = 100, train_batch = 128;
  int iters = 20, stage = 1;
  std::string train_data, train_model = "mlp";
  DType precision = DType::f32;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--params" && i + 1 < argc) {
      params = std::stoll(argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::stoi(argv[++i]);
    } else if (a == "--train" && i + 1 < argc) {
      train_data = argv[++i];
    } else if (a == "--model" && i + 1 < argc) {
      train_model = argv[++i];
    } else if (a == "--steps" && i + 1 < argc) {
      train_steps = std::stoll(argv[++i]);
    } else if (a == "--stage" && i + 1 < argc &&
               (std::strcmp(argv[i + 1], "1") == 0 || std::strcmp(argv[i + 1], "2") == 0)) {
      stage = std::stoi(argv[++i]);
    } else if (a == "--batch" && i + 1 < argc) {
      train_batch = std::stoll(argv[++i]);
    } else if (a == "--precision" && i + 1 < argc) {
      const std::string p = argv[++i];
      precision = p == "bf16" ? DType::bf16 : p == "fp16" ? DType::f16 : DType::f32;
    } else {
      std::fprintf(stderr,
                   "usage: mpirun -n W zero_bench [--params N] [--precision fp32|bf16] "
                   "[--iters K] [--train DATA [--model NAME] [--steps K] [--batch G] "
                   "[--stage 1|2]]\n");
      MPI_Finalize();
      return a == "--help" ? 0 : 1;
    }
  }
  int rank = 0, world = 1;
  {
    ringtrain::comm::MpiCommunicator comm(MPI_COMM_WORLD);
    rank = comm.rank();
    world = comm.size();
    const int64_t gpt2 = gpt2_params(50257), gpt2_padded = gpt2_params(50304);
    if (rank == 0) {
      print_memory("GPT-2 124M (vocab 50257)", gpt2, gpt2_fp32_read(), DType::bf16);
      print_memory("GPT-2 124M (vocab 50257)", gpt2, gpt2_fp32_read(), DType::f32);
      std::printf("(GPT-2 124M with the vocabulary padded to 50304, as llm.c allocates: %lld)\n",
                  static_cast<long long>(gpt2_padded));
    }
    const int64_t p = params > 0 ? params : 1 << 22;
    const int64_t es = int64_t(ringtrain::dtype_size(precision));
    if (rank == 0) {
      std::printf(
          "\n# bytes sent per rank per step (ring model), %lld parameters, gradients in %s\n",
          static_cast<long long>(p), ringtrain::dtype_name(precision));
      std::printf("%-4s %16s %16s %16s %8s\n", "W", "zero0 allreduce", "zero1 r-scatter",
                  "zero1 all-gather", "ratio");
      for (int w = 2; w <= 4; ++w) {
        const double f = double(w - 1) / w;
        const double ar = 2 * f * double(p * es), rs = f * double(p * es), ag = f * double(p * es);
        std::printf("%-4d %16.0f %16.0f %16.0f %8.3f\n", w, ar, rs, ag, (rs + ag) / ar);
      }
    }
    // Measured: one allreduce against reduce-scatter + all-gather of the same fp32 buffer.
    const ringtrain::comm::ShardLayout s(p, world);
    std::vector<float> buf(size_t(p), 1.f);
    auto time_it = [&](auto f) {
      f();
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) f();
      comm.barrier();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    };
    const double t_ar =
        time_it([&] { comm.allreduce(buf.data(), p, DType::f32, ringtrain::comm::ReduceOp::sum); });
    const double t_z = time_it([&] {
      comm.reduce_scatter(buf.data(), s.counts_in(0, p), DType::f32,
                          ringtrain::comm::ReduceOp::sum);
      comm.allgatherv(buf.data(), s.counts_in(0, p), DType::f32);
    });
    if (rank == 0)
      std::printf(
          "\n# measured on %d ranks, %lld fp32 elements: allreduce %.3f ms, reduce-scatter + "
          "all-gather %.3f ms, ratio %.3f\n",
          world, static_cast<long long>(p), t_ar * 1e3, t_z * 1e3, t_z / t_ar);
    if (!train_data.empty()) {
      if (rank == 0) {
        std::printf(
            "\n# training step time on %d ranks, --zero %d against --zero 0 alternated, global "
            "batch %lld, AdamW, 1 thread/rank\n",
            world, stage, static_cast<long long>(train_batch));
        const std::string ms = "zero" + std::to_string(stage) + " ms";
        const std::string med = "zero" + std::to_string(stage) + " med";
        std::printf("%-6s %-6s %6s %12s %12s %8s %12s %12s %8s\n", "model", "prec", "steps",
                    "zero0 ms", ms.c_str(), "ratio", "zero0 med", med.c_str(), "ratio");
      }
      ringtrain::comm::MpiCommunicator c0(MPI_COMM_WORLD), c1(MPI_COMM_WORLD);
      for (DType prec : {DType::f32, DType::bf16})
        time_training(c0, c1, train_data, train_model, prec, train_steps, train_batch, stage);
    }
  }
  MPI_Finalize();
  return 0;
}
