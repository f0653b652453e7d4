// `ringtrain model show FILE|NAME [--input C,H,W]`: the layer table of a model (node, op,
// output shape, parameters, forward FLOPs per sample, dtype under --precision and
// --layer-precision) and its totals, as Keras's summary() or torchinfo print it. Reads no
// data and allocates no parameters.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <set>

#include "core/error.hpp"
#include "launch/commands.hpp"
#include "launch/config.hpp"
#include "nn/tensor_parallel.hpp"
#include "ringtrain/model.pb.h"
#include "train/job.hpp"
#include "train/memory_plan.hpp"
#include "train/model_source.hpp"

namespace po = boost::program_options;

namespace ringtrain::launch {

namespace {

Shape parse_shape(const std::string& s) {
  Shape out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(start, end - start);
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    RT_REQUIRE(used == item.size() && !item.empty() && v > 0, "--input '", s,
               "' is not a shape; expected positive integers C,H,W (e.g. 1,28,28) or D");
    out.push_back(v);
    start = end + 1;
  }
  return out;
}

std::string human(double v) {
  char buf[32];
  if (v >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

// The bytes of each category a rank would hold (rank 0: the largest shard), planned from
// the shapes alone.
void show_plan(const ModelFile& f, const ModelShowConfig& c, DType precision) {
  const PlanModel m = PlanModel::from_file(f);
  PlanSettings s;
  s.world = c.ranks;
  s.zero = c.zero;
  s.recompute_blocks = c.recompute == "blocks";
  s.on_gpu = c.device == "cuda";
  s.precision = s.wire = precision;
  s.optimizer_states = c.optimizer == "adamw" ? 2 : 1;
  // A CPU optimizer reads the reduced 16-bit sums itself; a GPU's gets an fp32 gradient.
  s.fp32_grad = s.on_gpu;
  s.micro_batch = c.batch_size;
  s.grad_accum = c.grad_accum;
  const MemoryPlan plan = plan_memory(m, s);
  std::printf("model '%s': %lld parameters (%lld read in fp32), %d repeat-body block(s)\n",
              m.name.c_str(), static_cast<long long>(m.params), static_cast<long long>(m.fp32_read),
              m.blocks);
  std::printf(
      "memory plan per rank: %d rank(s), --zero %d, --recompute %s, %s, %s, %lld sample(s) of "
      "%s per micro-batch x %lld, device %s\n",
      c.ranks, c.zero, c.recompute.c_str(), dtype_name(precision), c.optimizer.c_str(),
      static_cast<long long>(c.batch_size), shape_str(m.input).c_str(),
      static_cast<long long>(c.grad_accum), c.device.c_str());
  std::printf("%-12s %20s %12s\n", "category", "bytes/rank", "");
  for (int k = 0; k < kMemCategories; ++k)
    std::printf("%-12s %20lld %12s\n", mem_category_name(MemCategory(k)),
                static_cast<long long>(plan.bytes[size_t(k)]),
                human_bytes(plan.bytes[size_t(k)]).c_str());
  std::printf("%-12s %20lld %12s\n", "total", static_cast<long long>(plan.total()),
              human_bytes(plan.total()).c_str());
  const int64_t state = plan.at(MemCategory::masters) + plan.at(MemCategory::optimizer);
  std::printf("masters + optimizer state: %.3f bytes per parameter per rank (x %d ranks: %.3f)\n",
              double(state) / double(std::max<int64_t>(m.params, 1)), c.ranks,
              double(state) * c.ranks / double(std::max<int64_t>(m.params, 1)));
}

void show(const ModelShowConfig& c, const std::string& precision) {
  load_plugins(c.plugins);
  ModelFile f = ModelFile::load(c.model);
  for (const auto& v : c.model_vars) f.override_var(v.var, v.value, v.option);
  Shape input = c.input.empty() ? f.input_shape() : parse_shape(c.input);
  // A language model's file states no input_shape (it takes any T up to its context): it is
  // shown at [context] tokens (--seq-len T: at T), predicting its (padded) vocabulary.
  const ExprScope vars = f.scope();
  const bool token_model = f.has_var("context") && f.has_var("padded_vocab");
  RT_REQUIRE(c.seq_len == 0 || token_model, "--seq-len is for language models; model '", f.name(),
             "' takes ", input.empty() ? "samples" : shape_str(input));
  if (input.empty() && token_model) input = {c.seq_len ? c.seq_len : vars.at("context").i};
  RT_REQUIRE(!input.empty(), "model show: model '", f.name(), "' (", f.origin(),
             ") states no input_shape; give --input C,H,W (e.g. --input 1,28,28)");
  const int64_t classes = c.classes     ? c.classes
                          : f.classes() ? f.classes()
                          : token_model ? vars.at("padded_vocab").i
                                        : 10;
  f.set_data_shape(input, classes, c.input.empty() ? "--classes" : "--input");
  f.add_layer_precision(c.layer_precision);  // checked by plan_model, as for train
  if (c.plan) return show_plan(f, c, parse_float_dtype(precision, "--precision"));
  const ModelPlan plan = plan_model(f);
  auto nodes = make_graph_nodes(f, plan);  // also checks init and share
  // --tensor-parallel T: rank 0's part of each split node (every rank's is the same size).
  const int t = c.tensor_parallel;
  TensorParallelGroup group{0, t, nullptr};
  std::vector<std::string> split_of(plan.nodes.size());
  if (t > 1) {
    const auto split = plan_tensor_parallel(plan, t);
    apply_tensor_parallel(nodes, plan, split, &group);
    for (const auto& sn : split) split_of[sn.node] = tensor_split_role_name(sn.role);
  }
  std::printf("model '%s' (%s): input %s, %lld classes\n", f.name().c_str(), f.origin().c_str(),
              shape_str(plan.input).c_str(), static_cast<long long>(plan.classes));
  if (t > 1)
    std::printf("--tensor-parallel %d: params are one rank's; split: %s\n", t,
                "column-parallel = 1/T of the outputs, row-parallel = 1/T of the inputs (output "
                "summed over the group), heads split = 1/T of the heads; other nodes whole on "
                "every rank");
  std::printf("%-28s %-16s %-16s %12s %14s  %-5s %s\n", "node", "op", "output", "params",
              "FLOPs/sample", "dtype", "inputs");
  int64_t total_params = 0, split_params = 0;
  double total_flops = 0;
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    const PlannedNode& n = plan.nodes[i];
    int64_t params = 0;
    std::set<std::string> shared;
    for (const auto& s : n.def->share()) shared.insert(s.param());
    for (const auto& ps : nodes[i].layer->param_specs()) {
      if (shared.count(ps.name)) continue;
      params += shape_numel(ps.shape);
      if (nodes[i].layer->param_split(ps.name).split()) split_params += shape_numel(ps.shape);
    }
    total_params += params;
    total_flops += n.flops;
    std::string ins;
    for (int in : n.inputs)
      ins +=
          (ins.empty() ? "" : ", ") + (in < 0 ? std::string("input") : plan.nodes[size_t(in)].name);
    const std::string dtype = n.dtype ? dtype_name(*n.dtype) : precision;
    std::printf("%-28s %-16s %-16s %12lld %14s  %-5s %s%s%s\n", n.name.c_str(), n.op.c_str(),
                shape_str(n.out).c_str(), static_cast<long long>(params), human(n.flops).c_str(),
                dtype.c_str(), ins.c_str(), shared.empty() ? "" : " (shares parameters)",
                split_of[i].empty() ? "" : cat(" [", split_of[i], "]").c_str());
  }
  if (t > 1)
    std::printf(
        "--tensor-parallel %d: %lld parameters per rank (%lld in parts of split "
        "tensors, 1/%d each; %lld whole on every rank)\n",
        t, static_cast<long long>(total_params), static_cast<long long>(split_params), t,
        static_cast<long long>(total_params - split_params));
  std::printf(
      "total: %zu nodes, %lld parameters (%s fp32 masters), %s FLOPs/sample forward "
      "(about 3x that per trained sample)\n",
      plan.nodes.size(), static_cast<long long>(total_params),
      (human(double(total_params) * 4) + "B").c_str(), human(total_flops).c_str());
  std::string metrics;
  for (const auto& m : plan.loss.metrics) metrics += (metrics.empty() ? "" : ", ") + m;
  std::printf("loss: %s, computed in fp32 against %s%s%s\n", plan.loss.name().c_str(),
              target_kind_name(plan.loss.target_kind()),
              plan.loss.is_default() && !f.def().has_loss() ? " (the default)" : "",
              metrics.empty() ? "" : ("; metrics: " + metrics).c_str());
}

}  // namespace

int cmd_model(const std::vector<std::string>& args, comm::Communicator& comm) {
  ModelShowConfig c;
  std::string precision = "fp32";
  bool help = false;
  run_and_agree(comm, [&] {
    RT_REQUIRE(!args.empty() && args[0] == "show",
               "ringtrain model: expected a subcommand: `ringtrain model show FILE|NAME "
               "[--input C,H,W]`",
               args.empty() ? "" : cat(" (got '", args[0], "')"));
    po::options_description desc("model show options");
    // clang-format off
    desc.add_options()
        ("help,h", "this help")
        ("model", po::value(&c.model), "a built-in name (mlp, cnn, resnet) or a model file")
        ("input", po::value(&c.input), "one sample's shape, C,H,W or D (default: the file's input_shape)")
        ("classes", po::value(&c.classes), "number of classes (default: the file's, else 10)")
        ("precision", po::value(&precision)->default_value("fp32"), "the run's compute dtype, for the dtype column")
        ("layer-precision", po::value(&c.layer_precision), "per-layer compute dtype overrides, LAYER=DTYPE[,...] (e.g. conv1=fp32), as for train")
        ("hidden", po::value<std::string>(), "mlp: var hidden")
        ("dropout", po::value<std::string>(), "cnn: var dropout")
        ("depth", po::value<std::string>(), "resnet: var depth")
        ("width", po::value<std::string>(), "resnet: var width")
        ("activation", po::value<std::string>(), "resnet: var activation")
        ("set", po::value<std::vector<std::string>>()->composing(), "VAR=VALUE: set a var of the model file")
        ("plugin", po::value<std::vector<std::string>>(&c.plugins)->composing(), "LIB.so: load a plugin's ops")
        ("plan", po::bool_switch(&c.plan), "print the memory plan per rank instead of the layer table (nothing is allocated)")
        ("tensor-parallel", po::value(&c.tensor_parallel)->default_value(1), "T: show what each transformer block splits across T ranks and the parameters per rank (as train --tensor-parallel T)")
        ("ranks", po::value(&c.ranks)->default_value(1), "--plan: ranks W")
        ("zero", po::value(&c.zero)->default_value(0), "--plan: ZeRO stage 0 to 3")
        ("recompute", po::value(&c.recompute)->default_value("none"), "--plan: none | blocks (repeat bodies' activations recomputed in backward)")
        ("batch-size", po::value(&c.batch_size)->default_value(TrainConfig::kDefaultBatchSize), "--plan: samples per micro-batch per rank")
        ("seq-len", po::value(&c.seq_len), "tokens per sample of a language model (default: its context)")
        ("grad-accum", po::value(&c.grad_accum)->default_value(1), "--plan: micro-batches per step")
        ("optimizer", po::value(&c.optimizer)->default_value("adamw"), "--plan: adamw | sgd (with momentum)")
        ("device", po::value(&c.device)->default_value("cpu"), "--plan: cpu | cuda");
    // clang-format on
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    try {
      po::store(po::command_line_parser(std::vector<std::string>(args.begin() + 1, args.end()))
                    .options(desc)
                    .positional(pos)
                    .run(),
                vm);
      po::notify(vm);
    } catch (const po::error& e) {
      throw_input(cat("ringtrain model show: ", e.what(), " (see ringtrain model show --help)"));
    }
    if (vm.count("help")) {
      help = true;
      if (comm.rank() == 0)
        std::cout << "usage: ringtrain model show FILE|NAME [--input C,H,W] [options]\n" << desc;
      return;
    }
    RT_REQUIRE(!c.model.empty(),
               "ringtrain model show: give a model file or a built-in name "
               "(mlp, cnn, resnet)");
    RT_REQUIRE(precision == "fp32" || precision == "fp16" || precision == "bf16", "--precision '",
               precision, "' is not known; expected fp32, fp16 or bf16");
    RT_REQUIRE(c.ranks >= 1, "--ranks ", c.ranks, " is not valid; expected a positive number");
    RT_REQUIRE(c.tensor_parallel >= 1, "--tensor-parallel ", c.tensor_parallel,
               " is not valid; expected a positive number");
    RT_REQUIRE(!c.plan || c.tensor_parallel == 1,
               "--plan with --tensor-parallel: the memory plan of a split model is not built "
               "yet; drop --plan to see the parameters per rank");
    RT_REQUIRE(c.zero >= 0 && c.zero <= 3, "--zero ", c.zero,
               " is not valid; expected 0, 1, 2 or 3");
    RT_REQUIRE(c.recompute == "none" || c.recompute == "blocks", "--recompute '", c.recompute,
               "' is not valid; expected none or blocks");
    RT_REQUIRE(c.batch_size >= 1, "--batch-size ", c.batch_size,
               " is not valid; expected a positive number");
    RT_REQUIRE(c.seq_len >= 0, "--seq-len ", c.seq_len,
               " is not valid; expected a positive number");
    RT_REQUIRE(c.grad_accum >= 1, "--grad-accum ", c.grad_accum,
               " is not valid; expected a positive number");
    RT_REQUIRE(c.optimizer == "adamw" || c.optimizer == "sgd", "--optimizer '", c.optimizer,
               "' is not known; expected adamw or sgd");
    RT_REQUIRE(c.device == "cpu" || c.device == "cuda", "--device '", c.device,
               "' is not known; expected cpu or cuda");
    for (const char* name : {"hidden", "dropout", "depth", "width", "activation"})
      if (vm.count(name))
        c.model_vars.push_back({name, vm[name].as<std::string>(), cat("--", name)});
    if (vm.count("set"))
      for (const auto& item : vm["set"].as<std::vector<std::string>>()) {
        const size_t eq = item.find('=');
        RT_REQUIRE(eq != std::string::npos && eq > 0, "--set '", item, "' is not VAR=VALUE");
        c.model_vars.push_back(
            {item.substr(0, eq), item.substr(eq + 1), "--set " + item.substr(0, eq)});
      }
    if (comm.rank() == 0) show(c, precision);
  });
  return 0;
}

}  // namespace ringtrain::launch
