// GPT training throughput (tokens/s), ringtrain's side of benchmarks/peers/gpt.sh: a model
// file (default models/gpt-tiny.pbtxt, sizes as vars) trained with AdamW on random token
// windows, one process per rank under mpirun, the gradient summed over the ranks with one
// MPI allreduce per step (in the compute dtype, as the Trainer's reducer sends it) and
// averaged. Each step: forward through the graph executor, the fused token cross-entropy,
// backward, allreduce, the read-only non-finite check of the average (the Trainer's unscale),
// AdamW on the fp32 masters reading the sums times 1/ranks (writing the 16-bit working
// copy). Rank 0
// prints the median tokens/s (all ranks) over windows of --window steps after --warmup
// steps, and with --json writes it as one JSON object. --recompute blocks frees each
// transformer block's activations after forward and recomputes them in backward;
// --recompute compare alternates windows without and with it (the same model, one run) and
// prints the step-time ratio and the executor's activation bytes at their peak (rank 0).
//
//   mpirun -n 2 build-cpu/bin/gpt_bench --threads 1 --batch-size 8 --seq-len 64 --steps 60
//       [--model FILE] [--var width=384 ...] [--precision bf16] [--json FILE]
//       [--recompute none|blocks|compare]
// (one command line)
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "nn/graph_builder.hpp"
#include "nn/optimizer.hpp"

namespace rt = ringtrain;

namespace {

struct Args {
  std::string model = std::string(RINGTRAIN_SOURCE_DIR) + "/models/gpt-tiny.pbtxt";
  std::vector<std::pair<std::string, std::string>> vars;
  int64_t batch = 8, seq = 64, vocab = 256, steps = 60, warmup = 10, window = 10;
  int threads = 1;
  rt::DType precision = rt::DType::f32;
  std::string json;
  std::string recompute = "none";  // none | blocks | compare
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// CPU time of this process (all threads) in seconds.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

int usage(const char* why) {
  std::fprintf(stderr,
               "%s\nusage: gpt_bench [--model FILE] [--var NAME=VALUE]... [--batch-size N] "
               "[--seq-len T] [--vocab V] [--steps N] [--warmup N] [--window N] [--threads N] "
               "[--precision fp32|bf16|fp16] [--json FILE] [--recompute none|blocks|compare]\n",
               why);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      usage("GPT training throughput: tokens/s of a model file on random tokens");
      MPI_Finalize();
      return 0;
    }
    if (i + 1 >= argc) return usage(("missing value after " + k).c_str());
    const std::string v = argv[++i];
    if (k == "--model")
      a.model = v;
    else if (k == "--var" && v.find('=') != std::string::npos)
      a.vars.push_back({v.substr(0, v.find('=')), v.substr(v.find('=') + 1)});
    else if (k == "--batch-size")
      a.batch = std::atoll(v.c_str());
    else if (k == "--seq-len")
      a.seq = std::atoll(v.c_str());
    else if (k == "--vocab")
      a.vocab = std::atoll(v.c_str());
    else if (k == "--steps")
      a.steps = std::atoll(v.c_str());
    else if (k == "--warmup")
      a.warmup = std::atoll(v.c_str());
    else if (k == "--window")
      a.window = std::atoll(v.c_str());
    else if (k == "--threads")
      a.threads = std::atoi(v.c_str());
    else if (k == "--precision" && (v == "fp32" || v == "bf16" || v == "fp16"))
      a.precision = v == "fp32" ? rt::DType::f32 : v == "bf16" ? rt::DType::bf16 : rt::DType::f16;
    else if (k == "--json")
      a.json = v;
    else if (k == "--recompute" && (v == "none" || v == "blocks" || v == "compare"))
      a.recompute = v;
    else
      return usage(("unknown option or value: " + k + " " + v).c_str());
  }
  if (a.batch < 1 || a.seq < 1 || a.threads < 1 || a.window < 1 || a.steps - a.warmup < a.window)
    return usage(
        "--batch-size, --seq-len, --threads must be positive and --steps - --warmup "
        ">= --window");
  try {
    rt::comm::MpiCommunicator comm(MPI_COMM_WORLD);
    auto be = rt::kernels::make_cpu_backend(a.threads);
    a.vars.push_back({"context", std::to_string(a.seq)});
    auto model = rt::build_model(a.model, {a.seq}, a.vocab, a.vars, a.precision);
    model->init_parameters(42, *be);
    const bool compare = a.recompute == "compare";
    model->set_recompute(a.recompute == "blocks");
    rt::OptimizerConfig oc;
    oc.name = "adamw";
    oc.lr = 3e-4f;
    oc.weight_decay = 0.1f;
    auto opt = rt::make_optimizer(oc, model->num_params());
    std::vector<rt::DecayRange> ranges;
    for (const auto& p : model->params()) ranges.push_back({p.offset, p.master.numel(), p.decay});
    opt->set_decay_ranges(ranges);

    std::mt19937 gen(uint32_t(1 + comm.rank()));
    std::uniform_int_distribution<int32_t> tok(0, int32_t(a.vocab - 1));
    std::vector<int32_t> x(size_t(a.batch * a.seq)), y(x.size());
    for (auto& t : x) t = tok(gen);
    for (auto& t : y) t = tok(gen);
    const rt::Tensor tokens(x.data(), {a.batch, a.seq}, rt::DType::i32);
    const rt::Tensor targets(y.data(), {a.batch, a.seq}, rt::DType::i32);
    rt::OwnedTensor dlogits;
    rt::Tensor work = model->work();
    rt::Context ctx{*be, a.precision, true, 0};
    double loss = 0;
    auto step = [&] {
      const rt::Tensor& logits = model->forward(ctx, tokens);
      rt::Tensor& d = dlogits.ensure(logits.shape, rt::DType::f32);
      loss = be->token_xent(logits, targets, a.vocab, 1.f, &d).loss_sum / double(a.batch * a.seq);
      model->backward(ctx, d);
      rt::Tensor g = model->grad();
      comm.allreduce(g.data, g.numel(), g.dtype, rt::comm::ReduceOp::sum);
      // As the Trainer does (train/trainer.cpp, unscale_and_check): a read-only non-finite
      // check of the average, which AdamW takes as it reads the sums.
      const float average = 1.f / float(comm.size());
      RT_REQUIRE(!be->unscale_check(g, average, rt::Tensor()), "non-finite gradients at loss ",
                 loss);
      opt->step(*be, model->master(), g, a.precision == rt::DType::f32 ? nullptr : &work, oc.lr,
                average);
    };
    for (int64_t i = 0; i < a.warmup; ++i) step();
    std::vector<double> rates, cpu_ms;
    // compare: per mode (0 without, 1 with recomputation) the step times and the peak of the
    // activation bytes, from each window's second step on (the first frees what the other
    // mode held).
    std::vector<double> step_ms[2], step_cpu_ms[2];
    size_t peak[2] = {0, 0};
    const double tokens_per_step = double(a.batch * a.seq * comm.size());
    for (int64_t w = 0; w < (a.steps - a.warmup) / a.window; ++w) {
      const int mode = int(w % 2);
      if (compare) model->set_recompute(mode == 1);
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = cpu_seconds();
      for (int64_t i = 0; i < a.window; ++i) {
        if (i == (a.window > 1 ? 1 : 0)) model->reset_activation_peak();
        step();
      }
      comm.barrier();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      rates.push_back(tokens_per_step * double(a.window) / s);
      cpu_ms.push_back((cpu_seconds() - c0) * 1e3 / double(a.window));
      step_ms[mode].push_back(s * 1e3 / double(a.window));
      step_cpu_ms[mode].push_back(cpu_ms.back());
      peak[mode] = std::max(peak[mode], model->activation_peak());
    }
    if (compare && comm.rank() == 0) {
      RT_REQUIRE(!step_ms[1].empty(), "--recompute compare needs two windows at least");
      const double none = median_of(step_ms[0]), blocks = median_of(step_ms[1]);
      const double cpu_none = median_of(step_cpu_ms[0]), cpu_blocks = median_of(step_cpu_ms[1]);
      std::printf(
          "recompute: step %.1f ms with blocks, %.1f ms without (ratio %.3f; rank 0's CPU time "
          "%.1f / %.1f ms, ratio %.3f); activation peak %.2f MiB with, %.2f MiB without (%.2fx "
          "less, %zu repeat bodies)\n",
          blocks, none, blocks / none, cpu_blocks, cpu_none, cpu_blocks / cpu_none,
          double(peak[1]) / 1048576.0, double(peak[0]) / 1048576.0,
          double(peak[0]) / double(peak[1]), model->recompute_segments());
    }
    const double median = median_of(rates);
    if (comm.rank() == 0) {
      // The CPU time per step of rank 0 (this process, all its threads) tells the step's cost
      // apart from time lost to other jobs on a shared machine.
      std::printf(
          "ringtrain %s: %.1f tokens/s (%lld parameters, loss %.4f; rank 0: %.1f ms CPU time "
          "per step)\n",
          rt::dtype_name(a.precision), median, (long long)model->num_params(), loss,
          median_of(cpu_ms));
      if (!a.json.empty()) {
        FILE* f = std::fopen(a.json.c_str(), "w");
        RT_REQUIRE(f, "--json ", a.json, ": cannot open for writing");
        std::fprintf(f,
                     "{\"framework\":\"ringtrain\",\"precision\":\"%s\",\"ranks\":%d,"
                     "\"threads\":%d,\"batch_size\":%lld,\"seq_len\":%lld,\"params\":%lld,"
                     "\"tokens_per_sec\":%.3f,\"loss\":%.6f,\"cpu_ms_per_step\":%.3f}\n",
                     rt::dtype_name(a.precision), comm.size(), a.threads, (long long)a.batch,
                     (long long)a.seq, (long long)model->num_params(), median, loss,
                     median_of(cpu_ms));
        std::fclose(f);
      }
    }
  } catch (const rt::Error& e) {
    std::fprintf(stderr, "gpt_bench: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, e.kind() == rt::ErrorKind::input ? 1 : 2);
  }
  MPI_Finalize();
  return 0;
}
