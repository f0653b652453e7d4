// The memory plan: the bytes a rank will hold in each category (core/memory_stats.hpp) for a
// model, a rank count, a ZeRO stage and an activation policy, computed from the model file's
// shapes and parameter specs alone -- nothing is allocated, so `ringtrain model show --plan`
// sizes a job of any W, and the Trainer checks the plan against --memory-budget before it
// builds the model. The same categories are measured while the run trains (the `memory`
// metrics record), so a plan and its measurement can be compared line by line.
//
// The formulas (P parameters, S a rank's shard of them, d the compute dtype's bytes, w the
// wire dtype's, k the optimizer's fp32 states per parameter, F the parameters read in fp32,
// U the parameters of the largest gather unit: a repeat-body block or a node outside one,
// with the parameters it shares; one unit is held at a time, the plan allows two):
//
//   category    --zero 0          --zero 1            --zero 2            --zero 3
//   masters     4P                4S                  4S                  4S
//   optimizer   4kP               4kS                 4kS                 4kS
//   working     dP (0 in fp32)    dP + 4F             dP + 4F             dS + 4F
//               (fp32 at --zero 1/2: masters 4P, working 0: one buffer holds the shard of
//               the masters and the all-gathered rest of the weights; fp32 --zero 3: 0)
//   gathered    0                 0                   0                   2dU
//   gradients   dP + [4P] + [wP]  dP + [4S] + [wP]    3dB + 4S + [3wB]    (same)
//
// [4P]/[4S]: the fp32 gradient, held in fp16/bf16 unless the optimizer reads the reduced sums
// itself (a backend with fused unscale, no clipping, no histograms); [wP]: the wire buffer
// when the wire dtype is not the compute dtype; B a bucket's elements (--bucket-mb of the
// wire dtype; at --zero 2/3 at most three buckets in flight, and 4S the fp32 sums of the
// shard, whatever the precision). Gradients also hold --grad-accum's fp32 sum (4P; 4S
// at --zero 2/3), a shared parameter's own gradient (d per element) and the fp32 scratch in which
// embeddings and normalisations sum their parameters' gradients. Masters include the fp32
// non-trainable state (BatchNorm's running averages).
//
// Activations are summed node by node from the graph's shapes at micro-batch b (what each
// op's layer keeps between forward and backward, its output, its input gradient, the sums of
// gradients of outputs read twice, the fp32 logits' gradient; docs/usage.md lists them);
// with --recompute blocks a repeat body keeps only its output and one block's activations
// are live again during backward. Workspace is the loader's (prefetch + 1) host batches (and
// on a GPU the uploaded batch); backend scratch (cuBLASLt, oneDNN) is not planned.
//
// Stages 2 and 3 and --recompute blocks are formulas here whether or not this build trains
// them (train/config.hpp says which it does), so a plan can be made for any of them.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/memory_stats.hpp"
#include "core/tensor.hpp"
#include "nn/graph_builder.hpp"
#include "nn/model_file.hpp"

namespace ringtrain::launch {

// What the planner reads of a model: its nodes' shapes (one sample), ops, dtypes and
// parameters, and the repeat-body blocks. Made from a ModelFile whose data shape is set;
// builds layers for their parameter specs, allocates no tensor.
struct PlanModel {
  struct Node {
    std::string name, op;
    std::vector<Shape> inputs;  // one sample each; model input: the data's sample shape
    std::vector<int> input_nodes;
    Shape out;
    std::optional<DType> dtype;  // a --layer-precision or file override
    int64_t params = 0;          // elements of the node's own parameters (shared ones apart)
    int64_t shared = 0;          // elements of parameters it shares with an earlier node
    int64_t fp32_read = 0;       // elements of its parameters read in fp32
    int64_t state = 0;           // fp32 non-trainable state elements
    int readers = 0;             // later nodes reading its output
    int block = -1;              // repeat-body instance it belongs to; -1: none
    bool relu = false;           // linear/conv with a fused ReLU
    int64_t heads = 0;           // attention
    double dropout = 0;          // dropout's p
  };
  std::string name;
  Shape input;
  bool tokens = false;  // takes token ids (int32) rather than float samples
  std::vector<Node> nodes;
  int blocks = 0;
  int64_t params = 0, fp32_read = 0, state = 0;

  static PlanModel from_file(const ModelFile& file);
};

struct PlanSettings {
  int world = 1;
  int rank = 0;  // whose shard (the shards differ by alignment); 0 holds the largest
  int zero = 0;  // 0..3
  bool recompute_blocks = false;
  bool on_gpu = false;
  DType precision = DType::f32;
  DType wire = DType::f32;
  int optimizer_states = 2;  // adamw 2, sgd with momentum 1, without 0
  bool fp32_grad = true;     // fp16/bf16: an fp32 gradient is kept (see above)
  int64_t micro_batch = 1, grad_accum = 1;
  int prefetch = 2;
  int64_t bucket_bytes = 25 << 20;
};

struct MemoryPlan {
  std::array<int64_t, kMemCategories> bytes{};
  int64_t at(MemCategory c) const { return bytes[size_t(c)]; }
  int64_t total() const;
};

// Input error naming --recompute when it asks for blocks of a model that has none.
MemoryPlan plan_memory(const PlanModel& model, const PlanSettings& s);

// "masters 1.2 GB, optimizer ..., workspace 3.1 MB; total 9.9 GB" (exact bytes with `exact`).
std::string plan_summary(const MemoryPlan& plan, bool exact = false);
std::string human_bytes(int64_t bytes);  // "1.50 GiB", "12.0 MiB", "512 B"

// --memory-budget's text: bytes with an optional K/M/G/T (powers of 1024, "B" or "iB" may
// follow), or "auto" (returns -1); input error naming the option otherwise.
int64_t parse_memory_budget(const std::string& text);
// auto: this rank's share of what the OS lets the node's processes use (the cgroup's
// memory.max, RLIMIT_AS, physical memory: the smallest, divided by `local_ranks`), or the
// GPU's memory when `gpu_bytes` > 0.
int64_t auto_memory_budget(int local_ranks, int64_t gpu_bytes);

// When `plan` exceeds `budget`: the message of the refusal, with the plan's figures and the
// smallest settings that would fit (a higher stage of those this build trains, then
// --recompute blocks, then the fewest ranks, with the per-rank batch kept); "" when it fits.
std::string check_budget(const PlanModel& model, const PlanSettings& s, int64_t budget,
                         const std::string& budget_text);

}  // namespace ringtrain::launch
