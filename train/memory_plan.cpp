// The memory planner (see memory_plan.hpp): a model's shapes to bytes per category and rank,
// the --memory-budget check with the settings that would fit, and the automatic budget.
#include "train/memory_plan.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "comm/grad_reducer.hpp"
#include "comm/shard_layout.hpp"
#include "core/error.hpp"
#include "ringtrain/model.pb.h"
#include "train/config.hpp"

namespace ringtrain::launch {

PlanModel PlanModel::from_file(const ModelFile& file) {
  const ModelPlan plan = plan_model(file);
  const auto layers = build_layers(plan);  // for their parameter specs only
  PlanModel m;
  m.name = file.name();
  m.input = plan.input;
  // Nodes made from one node of the file more than once lie in a repeat; an instance (a
  // block) ends where a node of the file comes round again or a node outside the repeat.
  std::map<const pb::Node*, int> made;
  for (const auto& n : plan.nodes) ++made[n.source];
  std::set<const pb::Node*> in_block;
  int block = -1;
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    const PlannedNode& pn = plan.nodes[i];
    Node n;
    n.name = pn.name;
    n.op = pn.op;
    n.inputs = pn.input_shapes;
    n.input_nodes = pn.inputs;
    n.out = pn.out;
    n.dtype = pn.dtype;
    std::set<std::string> shared;
    for (const auto& s : pn.def->share()) shared.insert(s.param());
    for (const auto& ps : layers[i]->param_specs()) {
      const int64_t k = shape_numel(ps.shape);
      if (shared.count(ps.name)) {
        n.shared += k;
        continue;
      }
      n.params += k;
      if (ps.reads_fp32 || pn.dtype) n.fp32_read += k;
    }
    for (const auto& bs : layers[i]->buffer_specs()) n.state += shape_numel(bs.shape);
    if (pn.def->has_linear()) n.relu = pn.def->linear().activation() == pb::RELU;
    if (pn.def->has_conv()) n.relu = pn.def->conv().activation() == pb::RELU;
    if (pn.def->has_attention()) n.heads = pn.def->attention().heads();
    if (pn.def->has_dropout()) n.dropout = pn.def->dropout().p();
    for (int in : pn.inputs) {
      if (in >= 0) ++m.nodes[size_t(in)].readers;
      if (in < 0 && pn.op == "embedding") m.tokens = true;
    }
    if (made[pn.source] > 1) {
      if (block < 0 || in_block.count(pn.source)) {
        block = m.blocks++;
        in_block.clear();
      }
      in_block.insert(pn.source);
      n.block = block;
    } else {
      block = -1;
      in_block.clear();
    }
    m.params += n.params;
    m.fp32_read += n.fp32_read;
    m.state += n.state;
    m.nodes.push_back(std::move(n));
  }
  return m;
}

int64_t MemoryPlan::total() const {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}

namespace {

int64_t size_of(DType t) { return int64_t(dtype_size(t)); }

// What node `i` keeps between forward and backward, and its input gradients, at batch b;
// `out_dtype` of every node so far (a node's inputs are earlier nodes' outputs).
int64_t node_activation_bytes(const PlanModel& m, size_t i, int64_t b, DType compute,
                              const std::vector<DType>& out_dtype) {
  const PlanModel::Node& n = m.nodes[i];
  const DType d = n.dtype.value_or(compute);
  const int64_t ds = size_of(d), os = size_of(out_dtype[i]);
  const int64_t y = shape_numel(n.out) * b;
  const int64_t x = n.inputs.empty() ? 0 : shape_numel(n.inputs[0]) * b;
  bool needs_dx = false;
  for (int in : n.input_nodes) needs_dx = needs_dx || in >= 0;
  const DType in_dtype = n.input_nodes.empty() || n.input_nodes[0] < 0
                             ? (m.tokens ? DType::i32 : compute)
                             : out_dtype[size_t(n.input_nodes[0])];
  // An input in another float dtype is cast into the layer's first.
  const int64_t xin = is_float(in_dtype) && in_dtype != d ? x * ds : 0;
  const int64_t dx = needs_dx ? x * ds : 0;
  if (n.op == "linear") return y * os + (n.relu ? y * os : 0) + dx + xin;
  if (n.op == "conv") {
    // A fused ReLU's gradient mask is applied by a reading convolution or pooling instead.
    bool by_next = false;
    if (n.relu && n.readers == 1)
      for (size_t j = i + 1; j < m.nodes.size(); ++j)
        for (int in : m.nodes[j].input_nodes)
          if (in == int(i)) by_next = m.nodes[j].op == "conv" || m.nodes[j].op == "max_pool";
    return y * os + (n.relu && !by_next ? y * os : 0) + dx + xin;
  }
  if (n.op == "activation") return xin + y * os + x * ds;
  if (n.op == "max_pool") return xin + y * ds + y * 4 + x * ds;
  if (n.op == "global_avg_pool") return y * os + x * ds;
  if (n.op == "batch_norm") return xin + y * os + x * ds + 2 * n.out.at(0) * 4;
  if (n.op == "layer_norm") return xin + y * os + x * ds + 2 * (x / n.out.back()) * 4;
  if (n.op == "rms_norm") return xin + y * os + x * ds + (x / n.out.back()) * 4;
  if (n.op == "mul") return y * os + (needs_dx ? 2 * x * ds : 0);
  if (n.op == "attention" && n.inputs.size() == 3) {
    // q, k, v -> the rotary pack [B, T, 3C] and its gradient, the output, the log-sum-exp,
    // and the gradients of q, k and v
    const int64_t t = n.out.at(0), kv = shape_numel(n.inputs[1]) * b;
    return 3 * y * ds + y * ds + (out_dtype[i] != d ? y * os : 0) + 4 * b * n.heads * t +
           3 * y * ds + y * ds + 2 * kv * ds;
  }
  if (n.op == "attention") {
    const int64_t t = n.out.at(0);
    return xin + y * ds + (out_dtype[i] != d ? y * os : 0) + 4 * b * n.heads * t + x * ds;
  }
  if (n.op == "embedding" || n.op == "add") return y * os;
  if (n.op == "concat") {
    int64_t all = 0;
    for (const Shape& s : n.inputs) all += shape_numel(s) * b * ds;
    return y * os + all;
  }
  if (n.op == "dropout") {
    const int64_t es = size_of(in_dtype);
    return n.dropout > 0 ? y * es + y + y * es : 0;  // output, mask (u8), input gradient
  }
  if (n.op == "flatten" || n.op == "reshape") return 0;  // views
  int64_t all_dx = 0;  // another op (a plugin's): its output and its inputs' gradients
  if (needs_dx)
    for (const Shape& s : n.inputs) all_dx += shape_numel(s) * b * ds;
  return y * os + all_dx;
}

}  // namespace

MemoryPlan plan_memory(const PlanModel& m, const PlanSettings& s) {
  RT_REQUIRE(s.zero >= 0 && s.zero <= 3, "--zero ", s.zero, " is not valid; expected 0 to 3");
  RT_REQUIRE(s.world >= 1 && s.rank >= 0 && s.rank < s.world, "--ranks ", s.world,
             " is not valid; expected a positive number");
  RT_REQUIRE(!s.recompute_blocks || m.blocks > 0, "--recompute blocks: model '", m.name,
             "' has no repeat body (no block of nodes repeated) whose activations could be "
             "recomputed; use --recompute none");
  RT_REQUIRE(s.micro_batch >= 1, "the batch per rank ", s.micro_batch,
             " is not valid; expected a positive number");
  using C = MemCategory;
  MemoryPlan plan;
  auto add = [&](C c, int64_t b) { plan.bytes[size_t(c)] += b; };
  const int64_t p = m.params, f = m.fp32_read;
  const int64_t shard = s.zero == 0 ? p : comm::ShardLayout(p, s.world).count(s.rank);
  const DType cd = s.precision;
  const int64_t d = size_of(cd), w = size_of(s.wire);
  const bool mixed = cd != DType::f32, wire_buffer = s.wire != cd;

  // fp32 at --zero 1/2: one fp32 buffer is the shard of the masters and the all-gathered
  // rest of the weights (as allocated: one buffer, one category, masters).
  const bool whole_fp32 = !mixed && (s.zero == 1 || s.zero == 2);
  add(C::masters, 4 * (whole_fp32 ? p : shard) + 4 * m.state);
  add(C::optimizer, 4 * int64_t(s.optimizer_states) * shard);
  if (s.zero == 0)
    add(C::working, mixed ? d * p : 0);
  else if (s.zero < 3)
    add(C::working, mixed ? d * p + 4 * f : 0);
  else
    add(C::working, mixed ? d * shard + 4 * f : 0);

  // Gather units: each block, and each node outside one, with the parameters they share (the
  // GPT head gathers embed.wte again).
  std::map<int, int64_t> block_params;
  int64_t unit = 0;
  for (const auto& n : m.nodes)
    if (n.block >= 0)
      block_params[n.block] += n.params + n.shared;
    else
      unit = std::max(unit, n.params + n.shared);
  for (const auto& [b, k] : block_params) unit = std::max(unit, k);
  if (s.zero == 3) add(C::gathered, 2 * d * unit);

  const int64_t bucket = std::max<int64_t>(1, s.bucket_bytes / w);  // --bucket-mb: wire bytes
  // --zero 2/3: the fp32 sums of this rank's shard, and at most kMaxInFlight buckets (each
  // in the compute dtype, and the wire dtype's copy) between backward and their
  // reduce-scatter (comm/grad_reducer.hpp).
  const int64_t in_flight = std::min(p, int64_t(comm::GradReducer::kMaxInFlight) * bucket);
  if (s.zero <= 1) {
    add(C::gradients, d * p + (mixed && s.fp32_grad ? 4 * shard : 0) + (wire_buffer ? w * p : 0));
  } else {
    add(C::gradients, d * in_flight + 4 * shard + (wire_buffer ? w * in_flight : 0));
  }
  if (s.grad_accum > 1) add(C::gradients, 4 * (s.zero <= 1 ? p : shard));

  // Per node: dtype-override copies of weights and gradients, shared parameters' own
  // gradients, the fp32 scratch of summed parameter gradients; activations.
  std::vector<DType> out_dtype(m.nodes.size());
  std::vector<int64_t> act(m.nodes.size());
  for (size_t i = 0; i < m.nodes.size(); ++i) {
    const auto& n = m.nodes[i];
    const DType nd = n.dtype.value_or(cd);
    out_dtype[i] = i + 1 == m.nodes.size() ? DType::f32 : nd;
    if (nd != cd) {
      if (nd != DType::f32) add(C::working, size_of(nd) * n.params);
      add(C::gradients, size_of(nd) * n.params);
    }
    add(C::gradients, d * n.shared);
    if (n.op == "embedding" || n.op == "layer_norm" || n.op == "rms_norm" || n.op == "batch_norm")
      add(C::gradients, 4 * n.params);
    act[i] = node_activation_bytes(m, i, s.micro_batch, cd, out_dtype);
    if (n.readers >= 2) act[i] += shape_numel(n.out) * s.micro_batch * size_of(nd);  // dy sums
  }
  int64_t activations = 0;
  if (!s.recompute_blocks) {
    for (int64_t a : act) activations += a;
  } else {
    // A block keeps its output; during its backward, its own activations are live again.
    std::map<int, int64_t> block_act, block_out;
    for (size_t i = 0; i < m.nodes.size(); ++i) {
      const int b = m.nodes[i].block;
      if (b < 0) {
        activations += act[i];
        continue;
      }
      block_act[b] += act[i];
      block_out[b] = shape_numel(m.nodes[i].out) * s.micro_batch * size_of(out_dtype[i]);
    }
    int64_t largest = 0;
    for (const auto& [b, a] : block_act) {
      activations += block_out[b];
      largest = std::max(largest, a);
    }
    activations += largest;
  }
  const Shape& last = m.nodes.back().out;
  activations += shape_numel(last) * s.micro_batch * 4;  // the logits' gradient, fp32
  if (mixed && !m.tokens) activations += shape_numel(m.input) * s.micro_batch * d;  // cast input
  add(C::activations, activations);

  // The loader's batches (this rank's slice of a step: micro-batch x --grad-accum): images
  // as fp32 with int32 labels, token windows as int32 ids and targets.
  const int64_t local = s.micro_batch * s.grad_accum;
  const int64_t sample = m.tokens ? shape_numel(m.input) * 8 : shape_numel(m.input) * 4 + 4;
  add(C::workspace,
      (std::max(s.prefetch, 0) + 1) * local * sample + (s.on_gpu ? local * sample : 0));
  return plan;
}

std::string human_bytes(int64_t bytes) {
  char buf[40];
  const double v = double(bytes);
  if (bytes >= (int64_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", v / double(1 << 30));
  else if (bytes >= (int64_t(1) << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", v / double(1 << 20));
  else if (bytes >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", v / 1024);
  else
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  return buf;
}

std::string plan_summary(const MemoryPlan& plan, bool exact) {
  auto fmt = [&](int64_t b) { return exact ? cat(b, " B") : human_bytes(b); };
  std::string out;
  for (int c = 0; c < kMemCategories; ++c)
    out += cat(c ? ", " : "", mem_category_name(MemCategory(c)), " ", fmt(plan.bytes[size_t(c)]));
  return out + "; total " + fmt(plan.total());
}

int64_t parse_memory_budget(const std::string& text) {
  if (text == "auto") return -1;
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  for (const char* tail : {"iB", "B"})
    if (unit.size() >= std::string(tail).size() &&
        unit.compare(unit.size() - std::string(tail).size(), std::string::npos, tail) == 0) {
      unit.resize(unit.size() - std::string(tail).size());
      break;
    }
  const std::string units = "KMGT";
  double scale = 1;
  bool ok = used > 0 && v > 0 && unit.size() <= 1;
  if (ok && unit.size() == 1) {
    const size_t k = units.find(char(std::toupper(static_cast<unsigned char>(unit[0]))));
    ok = k != std::string::npos;
    for (size_t i = 0; ok && i <= k; ++i) scale *= 1024;
  }
  RT_REQUIRE(ok && v * scale >= 1 && v * scale < 9.2e18, "--memory-budget '", text,
             "' is not valid; expected bytes per rank with an optional K, M, G or T (powers of "
             "1024), e.g. 16G, or auto");
  return int64_t(v * scale);
}

int64_t auto_memory_budget(int local_ranks, int64_t gpu_bytes) {
  if (gpu_bytes > 0) return gpu_bytes;
  int64_t limit = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string v;
    if (in >> v && v != "max") {
      try {
        limit = std::min<int64_t>(limit, std::stoll(v));
      } catch (const std::exception&) {
      }
    }
  }
  rlimit r{};
  if (getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    limit = std::min<int64_t>(limit, int64_t(r.rlim_cur) * std::max(local_ranks, 1));
  return limit / std::max(local_ranks, 1);
}

std::string check_budget(const PlanModel& m, const PlanSettings& s, int64_t budget,
                         const std::string& budget_text) {
  const MemoryPlan plan = plan_memory(m, s);
  if (plan.total() <= budget) return "";
  auto fits = [&](int zero, bool recompute, int world) {
    PlanSettings t = s;
    t.zero = zero;
    t.recompute_blocks = recompute;
    t.world = world;
    t.rank = 0;  // the largest shard
    return plan_memory(m, t).total() <= budget;
  };
  std::vector<std::string> ways;
  int zero_fits = -1;  // the lowest higher stage that fits on these ranks as they are
  for (int z = s.zero + 1; z <= kMaxTrainZero; ++z)
    if (fits(z, s.recompute_blocks, s.world)) {
      ways.push_back(cat("--zero ", z));
      zero_fits = z;
      break;
    }
  // Recomputation, where it fits at a lower stage than a stage alone would.
  if (kTrainsRecompute && !s.recompute_blocks && m.blocks > 0)
    for (int z = s.zero; z <= (zero_fits < 0 ? kMaxTrainZero : zero_fits - 1); ++z)
      if (fits(z, true, s.world)) {
        ways.push_back(cat("--zero ", z, " --recompute blocks"));
        break;
      }
  // More ranks shard more (a stage of at least 1): the fewest that fit, per-rank batch kept;
  // not asked for once a stage fits on these ranks. A higher stage is not always smaller
  // (--zero 2's buckets in flight can outweigh the gradient of a small model).
  constexpr int kMaxWorld = 1 << 20;
  for (int z = std::max(s.zero, 1); z <= kMaxTrainZero && ways.empty(); ++z) {
    if (!fits(z, s.recompute_blocks, kMaxWorld)) continue;
    int lo = s.world, hi = kMaxWorld;  // lo does not fit (or is this run's), hi does
    while (hi - lo > 1) {
      const int mid = lo + (hi - lo) / 2;
      (fits(z, s.recompute_blocks, mid) ? hi : lo) = mid;
    }
    ways.push_back(
        cat("--zero ", z, s.recompute_blocks ? " --recompute blocks" : "", " on ", hi, " ranks"));
  }
  const std::string head =
      cat("--memory-budget ", budget_text, " (", human_bytes(budget),
          " per rank) is too small for model '", m.name, "' on ", s.world, " rank(s) at --zero ",
          s.zero, s.recompute_blocks ? " --recompute blocks" : "", " and ", s.micro_batch,
          " sample(s) per micro-batch: rank ", s.rank, " would hold ", plan_summary(plan));
  if (ways.empty())
    return cat(head, ". It fits at no --zero stage this build trains (0 to ", kMaxTrainZero, "), ",
               kTrainsRecompute ? "--recompute setting " : "",
               "or rank count: ", "activations and workspace alone are ",
               human_bytes(plan.at(MemCategory::activations) + plan.at(MemCategory::workspace)),
               "; lower --batch-size (or --seq-len), or raise --memory-budget");
  std::string list;
  for (size_t i = 0; i < ways.size(); ++i) list += (i ? "; or " : "") + ways[i];
  return cat(head, ". It would fit with ", list,
             " (`ringtrain model show MODEL --plan --ranks W --zero S` prints any plan)");
}

}  // namespace ringtrain::launch
