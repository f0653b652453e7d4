// plan_model: expands a model file into nodes (graph_expand.cpp), resolves inputs, orders
// the nodes topologically and infers every shape; build_model then makes the layers and the
// Model. Errors carry FILE:LINE:COLUMN and the node.
#include "nn/graph_builder.hpp"
#include "nn/tensor_parallel.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "core/error.hpp"
#include "nn/graph_expand.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {

namespace gp = google::protobuf;

namespace {

std::optional<DType> parse_precision(const std::string& v) {
  if (v == "fp32") return DType::f32;
  if (v == "fp16") return DType::f16;
  if (v == "bf16") return DType::bf16;
  return std::nullopt;
}

// A plugin op's attributes against the names and kinds it registered, each error at the
// attribute's own location (or the node's, for one a `set` added).
void check_attrs(const ModelFile& file, const std::string& op, const std::vector<AttrSpec>& specs,
                 const graph::Raw& raw) {
  const auto& attrs = raw.def->custom().attr();
  const auto& written = raw.source->custom().attr();
  auto kind_name = [](AttrKind k) {
    switch (k) {
      case AttrKind::integer:
        return "an integer (int_value)";
      case AttrKind::real:
        return "a number (float_value or int_value)";
      case AttrKind::string:
        return "a string (string_value)";
      case AttrKind::int_list:
        return "a list of integers (int_list)";
    }
    return "";
  };
  for (int k = 0; k < attrs.size(); ++k) {
    const pb::Attr& a = attrs[k];
    const std::string loc = k < written.size() ? file.where(written[k]) : file.where(*raw.source);
    const auto spec = std::find_if(specs.begin(), specs.end(),
                                   [&](const AttrSpec& s) { return s.name == a.name(); });
    if (spec == specs.end()) {
      std::string names;
      for (const auto& s : specs) names += (names.empty() ? "" : ", ") + s.name;
      graph::fail_at(loc, raw.name,
                     cat("op '", op, "' has no attribute '", a.name(),
                         "' (its attributes: ", names.empty() ? "none" : names, ")"));
    }
    for (int j = 0; j < k; ++j)
      if (attrs[j].name() == a.name())
        graph::fail_at(loc, raw.name, cat("attribute '", a.name(), "' is given twice"));
    const bool ok = (spec->kind == AttrKind::integer && a.has_int_value()) ||
                    (spec->kind == AttrKind::real && (a.has_float_value() || a.has_int_value())) ||
                    (spec->kind == AttrKind::string && a.has_string_value()) ||
                    (spec->kind == AttrKind::int_list && a.has_int_list());
    if (!ok)
      graph::fail_at(
          loc, raw.name,
          cat("attribute '", a.name(), "' of op '", op, "' needs ", kind_name(spec->kind)));
  }
}

}  // namespace

ModelPlan plan_model(const ModelFile& file) {
  const pb::Model& m = file.def();
  ModelPlan plan;
  plan.input = file.input_shape();
  plan.classes = file.classes();
  RT_REQUIRE(!plan.input.empty() && shape_numel(plan.input) > 0, "model '", file.name(),
             "' needs a non-empty input shape, got ", shape_str(plan.input));
  plan.loss = loss_spec_of(file);
  plan.target = file.target_shape();
  const bool labels = plan.loss.target_kind() == TargetKind::labels;
  RT_REQUIRE(plan.classes >= 2 ||
                 (plan.loss.target_kind() == TargetKind::float_targets && plan.classes == 0),
             "model '", file.name(), "' needs at least 2 classes, got ", plan.classes);
  RT_REQUIRE(m.node_size() > 0, file.origin(), ": model '", file.name(), "' has no nodes");

  // 1. Expansion.
  graph::Expansion ex = graph::expand_nodes(file);
  std::vector<graph::Raw>& raws = ex.raws;
  RT_REQUIRE(!raws.empty(), file.origin(), ": model '", file.name(), "' expands to no nodes");

  // 2. Inputs by name.
  std::map<std::string, int> index;
  for (size_t i = 0; i < raws.size(); ++i) index[raws[i].name] = int(i);
  std::function<int(const graph::Ref&, int)> resolve = [&](const graph::Ref& r, int depth) -> int {
    if (r.model_input) return -1;
    if (depth > 64) return -2;
    if (!r.exact.empty()) {
      if (auto it = index.find(r.exact); it != index.end()) return it->second;
      if (auto it = ex.aliases.find(r.exact); it != ex.aliases.end())
        return resolve(it->second, depth + 1);
      return -2;
    }
    for (size_t k = r.prefixes.size(); k-- > 0;) {
      const std::string full = r.prefixes[k] + r.text;
      if (auto it = index.find(full); it != index.end()) return it->second;
      if (auto it = ex.aliases.find(full); it != ex.aliases.end())
        return resolve(it->second, depth + 1);
    }
    return -2;
  };
  std::vector<std::vector<int>> inputs(raws.size());
  for (size_t i = 0; i < raws.size(); ++i)
    for (size_t k = 0; k < raws[i].refs.size(); ++k) {
      const int in = resolve(raws[i].refs[k], 0);
      const bool implicit = raws[i].source->input_size() == 0;
      if (in == -2)
        graph::fail_at(
            file.where(*raws[i].source, "input", int(k)), raws[i].name,
            cat("input '",
                raws[i].refs[k].text.empty() ? raws[i].refs[k].exact : raws[i].refs[k].text,
                "' is not a node of this model"));
      if (in == int(i))
        graph::fail_at(file.where(*raws[i].source, implicit ? "" : "input", int(k)), raws[i].name,
                       "a node cannot read its own output");
      inputs[i].push_back(in);
    }

  // 3. Output and topological order (file order where the edges allow it).
  int output = int(raws.size()) - 1;
  if (!m.output().empty()) {
    auto it = index.find(m.output());
    RT_REQUIRE(it != index.end() || ex.aliases.count(m.output()), file.where(m, "output"),
               ": output '", m.output(), "' is not a node of this model");
    output = it != index.end() ? it->second : resolve(ex.aliases.at(m.output()), 0);
  }
  std::vector<char> reaches(raws.size(), 0);
  reaches[size_t(output)] = 1;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < raws.size(); ++i)
      if (reaches[i])
        for (int in : inputs[i])
          if (in >= 0 && !reaches[size_t(in)]) reaches[size_t(in)] = changed = true;
  }
  std::vector<int> order;
  std::vector<char> placed(raws.size(), 0);
  while (order.size() < raws.size()) {
    int next = -1;
    for (size_t i = 0; i < raws.size() && next < 0; ++i) {
      if (placed[i]) continue;
      bool ready = true;
      for (int in : inputs[i]) ready = ready && (in < 0 || placed[size_t(in)]);
      if (ready) next = int(i);
    }
    if (next < 0) {  // a cycle: name it, from the first node left
      size_t first = 0;
      while (placed[first]) ++first;
      std::string path = raws[first].name;
      size_t at = first;
      std::set<size_t> seen{first};
      while (true) {
        int in = -1;
        for (int x : inputs[at])
          if (x >= 0 && !placed[size_t(x)]) in = x;
        if (in < 0) break;
        path += " <- " + raws[size_t(in)].name;
        if (!seen.insert(size_t(in)).second) break;
        at = size_t(in);
      }
      graph::fail_at(file.where(*raws[first].source, "input"), raws[first].name,
                     cat("its inputs form a cycle: ", path));
    }
    placed[size_t(next)] = 1;
    order.push_back(next);
  }
  for (size_t i = 0; i < raws.size(); ++i)
    if (!reaches[i])
      graph::fail_at(file.where(*raws[i].source), raws[i].name,
                     cat("its output is not used on the way to the model's output '",
                         raws[size_t(output)].name, "'"));

  // 4. Shapes, in order, before anything is allocated.
  std::vector<int> position(raws.size());
  for (size_t k = 0; k < order.size(); ++k) position[size_t(order[k])] = int(k);
  for (int i : order) {
    graph::Raw& raw = raws[size_t(i)];
    PlannedNode pn;
    pn.name = raw.name;
    pn.op = graph::op_name(*raw.def);
    pn.def = raw.def;
    pn.source = raw.source;
    pn.repeat_body = raw.repeat_body;
    for (int in : inputs[size_t(i)]) {
      pn.inputs.push_back(in < 0 ? -1 : position[size_t(in)]);
      pn.input_shapes.push_back(in < 0 ? plan.input : plan.nodes[size_t(position[size_t(in)])].out);
    }
    const std::string loc = file.where(*raw.source);
    const OpDef* op = find_op(pn.op);
    if (!op) {
      const auto known = registered_ops();
      std::string names;
      for (const auto& n : known) names += (names.empty() ? "" : ", ") + n;
      graph::fail_at(
          loc, pn.name,
          cat("unknown op '", pn.op, "' (ops: ", names, "; a plugin's op needs --plugin LIB.so)"));
    }
    const int n_in = int(pn.inputs.size());
    if (n_in < op->min_inputs || (op->max_inputs >= 0 && n_in > op->max_inputs))
      graph::fail_at(loc, pn.name,
                     cat(pn.op, " takes ", op->min_inputs,
                         op->max_inputs < 0                 ? " or more"
                         : op->max_inputs == op->min_inputs ? ""
                                                            : cat(" to ", op->max_inputs),
                         " input(s), got ", n_in));
    if (pn.def->has_custom()) check_attrs(file, pn.op, op_attrs(pn.op), raw);
    const OpNode on{*pn.def, pn.name, pn.input_shapes};
    try {
      pn.out = op->infer(on);
      pn.flops = op->flops ? op->flops(on, pn.out) : double(shape_numel(pn.out));
    } catch (const Error& e) {
      std::string shapes;
      for (const auto& s : pn.input_shapes) shapes += (shapes.empty() ? "" : ", ") + shape_str(s);
      graph::fail_at(loc, pn.name, cat(pn.op, ": ", e.what(), " (input shape(s) ", shapes, ")"));
    }
    if (!raw.source->precision().empty()) {
      pn.dtype = parse_precision(raw.source->precision());
      if (!pn.dtype)
        graph::fail_at(file.where(*raw.source, "precision"), pn.name,
                       cat("precision '", raw.source->precision(), "' is not fp32, fp16 or bf16"));
    }
    plan.nodes.push_back(std::move(pn));
  }
  const PlannedNode& last = plan.nodes.back();
  // A language model: token ids [T] in, logits [T, V] out (one prediction per position), V
  // the vocabulary padded as the file chooses, so at least the data's.
  const bool per_token =
      plan.input.size() == 1 && last.out.size() == 2 && last.out[0] == plan.input[0];
  if (per_token && last.out[1] < plan.classes)
    graph::fail_at(file.where(*last.source), last.name,
                   cat("the model predicts ", last.out[1],
                       " tokens per position but the data's "
                       "vocabulary has ",
                       plan.classes, "; use a model with a vocabulary (padded_vocab) of at least ",
                       plan.classes));
  if (!labels)
    check_loss_output(plan.loss, last.out, plan.target, plan.classes,
                      cat(file.where(*last.source), ": node '", last.name, "': "));
  else if (!per_token && last.out != Shape{plan.classes})
    graph::fail_at(file.where(*last.source), last.name,
                   cat("the model's output has shape ", shape_str(last.out),
                       " per sample, but the data has ", plan.classes, " classes (expected [",
                       plan.classes, "]; `set { field: \"out_features\" expr: \"classes\" }`)"));

  // 5. --layer-precision: exact node names or prefixes at a dot ("stage2" for "stage2.*").
  for (const std::string& item : m.layer_precision()) {
    const size_t eq = item.find('=');
    RT_REQUIRE(eq != std::string::npos && eq > 0, "--layer-precision '", item,
               "' is not LAYER=DTYPE (e.g. conv1=fp32)");
    const std::string name = item.substr(0, eq);
    const auto dt = parse_precision(item.substr(eq + 1));
    RT_REQUIRE(dt, "--layer-precision '", item, "': '", item.substr(eq + 1),
               "' is not fp32, fp16 or bf16");
    bool any = false;
    for (auto& pn : plan.nodes)
      if (pn.name == name || pn.name.rfind(name + ".", 0) == 0) {
        pn.dtype = dt;
        any = true;
      }
    if (!any) {
      std::string names;
      for (const auto& pn : plan.nodes) names += (names.empty() ? "" : ", ") + pn.name;
      throw_input(
          cat("--layer-precision: the model has no layer '", name, "'; its layers are ", names));
    }
  }
  return plan;
}

std::vector<std::unique_ptr<Layer>> build_layers(const ModelPlan& plan) {
  std::vector<std::unique_ptr<Layer>> layers;
  for (const auto& pn : plan.nodes)
    layers.push_back(find_op(pn.op)->build(OpNode{*pn.def, pn.name, pn.input_shapes}));
  return layers;
}

namespace {

constexpr double kMaxInitStd = 1e37;  // x 5.8 stays below float32's 3.4e38

Init init_kind(pb::InitKind k) {
  switch (k) {
    case pb::KAIMING_UNIFORM:
      return Init::kaiming_uniform;
    case pb::KAIMING_NORMAL:
      return Init::kaiming_normal;
    case pb::XAVIER_UNIFORM:
      return Init::xavier_uniform;
    case pb::XAVIER_NORMAL:
      return Init::xavier_normal;
    case pb::NORMAL:
      return Init::normal;
    case pb::ZEROS:
      return Init::zeros;
    case pb::ONES:
      return Init::ones;
    default:
      return Init::fan_in_uniform;
  }
}

}  // namespace

std::vector<GraphNode> make_graph_nodes(const ModelFile& file, const ModelPlan& plan) {
  auto layers = build_layers(plan);
  std::vector<GraphNode> nodes;
  std::map<std::string, Shape> earlier;  // parameters of earlier nodes, for `share`
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    const PlannedNode& pn = plan.nodes[i];
    const pb::Node& src = *pn.source;
    GraphNode g;
    g.layer = std::move(layers[i]);
    g.inputs = pn.inputs;
    g.repeat_body = pn.repeat_body;
    if (pn.dtype) g.layer->set_dtype(*pn.dtype);
    std::set<std::string> own;
    std::map<std::string, Shape> own_shape;
    for (const auto& ps : g.layer->param_specs()) {
      own.insert(ps.name);
      own_shape[ps.name] = ps.shape;
    }
    auto param_names = [&] {
      std::string s;
      for (const auto& n : own) s += (s.empty() ? "" : ", ") + n;
      return s.empty() ? std::string("none") : s;
    };
    for (int k = 0; k < src.init_size(); ++k) {
      const pb::Init& in = src.init(k);
      if (!in.param().empty() && !own.count(in.param()))
        graph::fail_at(file.where(in, "param"), pn.name,
                       cat("init: the node has no parameter '", in.param(),
                           "' (its parameters: ", param_names(), ")"));
      // A draw reaches about 5.8 std (Box-Muller on 24-bit uniforms): beyond kMaxInitStd the
      // float32 weights would be infinite, and the run would train on NaN.
      if (in.kind() == pb::NORMAL && !(in.std() > 0 && in.std() <= kMaxInitStd))
        graph::fail_at(file.where(in, "std"), pn.name,
                       cat("init: NORMAL needs a positive std of at most ", kMaxInitStd, ", got ",
                           in.std(), " (larger draws are not finite in float32)"));
      if (in.kind() != pb::DEFAULT) g.init.push_back({in.param(), init_kind(in.kind()), in.std()});
    }
    if (src.has_weight_decay()) g.decay = src.weight_decay();
    for (int k = 0; k < src.share_size(); ++k) {
      const pb::Share& sh = src.share(k);
      if (!own.count(sh.param()))
        graph::fail_at(file.where(sh, "param"), pn.name,
                       cat("share: the node has no parameter '", sh.param(),
                           "' (its parameters: ", param_names(), ")"));
      auto from = earlier.find(sh.from());
      if (from == earlier.end())
        graph::fail_at(
            file.where(sh, "from"), pn.name,
            cat("share: '", sh.from(), "' is not a parameter of an earlier node (NODE.PARAM)"));
      if (from->second != own_shape[sh.param()])
        graph::fail_at(
            file.where(sh), pn.name,
            cat("share: parameter '", sh.param(), "' has shape ", shape_str(own_shape[sh.param()]),
                " but '", sh.from(), "' has ", shape_str(from->second)));
      g.shared[sh.param()] = sh.from();
    }
    for (const auto& n : own)
      if (!g.shared.count(n)) earlier[pn.name + "." + n] = own_shape[n];
    nodes.push_back(std::move(g));
  }
  return nodes;
}

namespace {

// Before any buffer is allocated: a lower bound of the memory the model needs against the
// machine's physical memory, so that `--hidden 100000,100000` or huge samples are an input
// error naming the values instead of "out of host memory" later. The bound counts 12 bytes
// per parameter (fp32 master, fp32-or-smaller gradient and working copy, no optimizer
// state) and one sample's fp32 input and largest activation; the real need is larger.
void require_fits_in_memory(const ModelFile& file, const ModelPlan& plan,
                            const std::vector<GraphNode>& nodes) {
  double params = 0;  // double: products of hostile sizes must not wrap
  for (const auto& node : nodes)
    for (const auto& ps : node.layer->param_specs()) {
      if (node.shared.count(ps.name)) continue;
      double n = 1;
      for (int64_t d : ps.shape) n *= double(d);
      params += n;
    }
  auto numel = [](const Shape& s) {
    double n = 1;
    for (int64_t d : s) n *= double(d);
    return n;
  };
  double largest = 0;
  for (const auto& p : plan.nodes) largest = std::max(largest, numel(p.out));
  const double need = 12 * params + 4 * (numel(plan.input) + largest);
  const double memory = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (need <= memory) return;
  std::string with;
  for (const auto& o : file.overrides()) with += (with.empty() ? " with " : ", ") + o;
  throw_input(cat("model '", file.name(), "'", with, " on samples of shape ", shape_str(plan.input),
                  " needs at least ", static_cast<long long>(std::min(need, 9.2e18)), " bytes (",
                  static_cast<long long>(std::min(params, 9.2e18)),
                  " parameters at 12 bytes each, plus one sample's input and largest "
                  "activation), more than this machine's ",
                  static_cast<long long>(memory),
                  " bytes of memory; use smaller layers (--hidden, --width, the file's vars) or "
                  "smaller samples"));
}

}  // namespace

std::unique_ptr<Model> build_model(const ModelFile& file, DType compute, bool flat_buffers,
                                   const TensorParallelGroup* group) {
  const ModelPlan plan = plan_model(file);
  std::vector<GraphNode> nodes = make_graph_nodes(file, plan);
  if (group && group->size > 1)
    apply_tensor_parallel(nodes, plan, plan_tensor_parallel(plan, group->size), group);
  require_fits_in_memory(file, plan, nodes);
  try {
    auto model =
        std::make_unique<Model>(std::move(nodes), compute, file.normalised(), flat_buffers);
    model->set_io(plan.input, plan.classes);
    model->set_loss(plan.loss, plan.target);
    return model;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::input) throw;
    throw_input(cat(file.origin(), ": ", e.what()));
  }
}

std::unique_ptr<Model> build_model(const std::string& name_or_path, const Shape& input,
                                   int64_t classes,
                                   const std::vector<std::pair<std::string, std::string>>& vars,
                                   DType compute, const std::string& layer_precision) {
  ModelFile f = ModelFile::load(name_or_path);
  for (const auto& [var, value] : vars) f.override_var(var, value, "--" + var);
  f.set_data_shape(input, classes, "the data");
  f.add_layer_precision(layer_precision);
  return build_model(f, compute);
}

std::string first_difference(const ModelPlan& here, const ModelPlan& there,
                             const std::string& here_is, const std::string& there_is) {
  if (here.input != there.input)
    return cat("the input shape: ", shape_str(here.input), " ", here_is, ", ",
               shape_str(there.input), " ", there_is);
  if (here.classes != there.classes)
    return cat("the classes: ", here.classes, " ", here_is, ", ", there.classes, " ", there_is);
  auto describe = [](const PlannedNode& n) {
    std::string s;
    gp::TextFormat::Printer p;
    p.SetSingleLineMode(true);
    pb::Node d = *n.def;
    d.clear_name();
    d.clear_set();
    d.clear_when();
    d.clear_precision();
    p.PrintToString(d, &s);
    std::string ins;
    for (int in : n.inputs) ins += cat(ins.empty() ? "" : ",", in);
    return cat(s, "inputs [", ins, "] out ", shape_str(n.out),
               n.dtype ? cat(" ", dtype_name(*n.dtype)) : "");
  };
  const size_t n = std::min(here.nodes.size(), there.nodes.size());
  for (size_t i = 0; i < n; ++i) {
    const auto& a = here.nodes[i];
    const auto& b = there.nodes[i];
    if (a.name != b.name)
      return cat("node ", i + 1, ": '", a.name, "' ", here_is, ", '", b.name, "' ", there_is);
    const std::string da = describe(a), db = describe(b);
    if (da != db) return cat("node '", a.name, "': ", da, " ", here_is, "; ", db, " ", there_is);
  }
  if (here.nodes.size() != there.nodes.size()) {
    const auto& longer = here.nodes.size() > n ? here.nodes : there.nodes;
    return cat("node '", longer[n].name, "' exists only ",
               here.nodes.size() > n ? here_is : there_is, " (", here.nodes.size(), " nodes ",
               here_is, ", ", there.nodes.size(), " ", there_is, ")");
  }
  return "";
}

}  // namespace ringtrain
