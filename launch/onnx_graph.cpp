// export_nodes(): each ringtrain op of a model plan as ONNX opset-17 nodes (see
// onnx_graph.hpp). Weights are the checkpoint's tensors under their names; BatchNorm is its
// inference form; dropout is no node; GELU is written out as opset 17 has no Gelu op.
#include "launch/onnx_graph.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/error.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain::launch {
namespace {

// The nodes of the plan as ONNX nodes; each ringtrain node's output is the ONNX value of
// its name (helper values are NAME/what).
class Exporter {
 public:
  Exporter(const ModelPlan& plan, Model& model, GraphWriter& w) : plan_(plan), w_(w) {
    for (Param& p : model.params()) params_[p.name] = &p;
    for (StateBuffer& b : model.buffers()) buffers_[b.name] = &b;
    for (const PlannedNode& n : plan.nodes)
      if (n.op == "embedding" && n.def->embedding().context() > mask_size_)
        mask_size_ = n.def->embedding().context();
  }

  // The value name of the graph's output node (the last of the plan).
  std::string run() {
    for (const PlannedNode& n : plan_.nodes) outs_.push_back(emit(n));
    return outs_.back();
  }

 private:
  std::string in(const PlannedNode& n, size_t k) const {
    const int i = n.inputs[k];
    return i < 0 ? std::string("input") : outs_[size_t(i)];
  }
  // The checkpoint name of parameter `p` of node n: its own, or the earlier node's it shares.
  static std::string owner(const PlannedNode& n, const std::string& p) {
    for (const pb::Share& s : n.def->share())
      if (s.param() == p) return s.from();
    return n.name + "." + p;
  }
  // Its initialiser (one per tensor: a shared one is read by both nodes).
  std::string param(const PlannedNode& n, const std::string& p) {
    const std::string name = owner(n, p);
    const auto it = params_.find(name);
    RT_CHECK(it != params_.end(), "node '", n.name, "': no parameter '", name, "' in the model");
    return w_.weight(name, it->second->shape, it->second->master.as<float>());
  }
  std::string buffer(const PlannedNode& n, const std::string& b) {
    const std::string name = n.name + "." + b;
    const auto it = buffers_.find(name);
    RT_CHECK(it != buffers_.end(), "node '", n.name, "': no buffer '", name, "' in the model");
    return w_.weight(name, it->second->shape, it->second->value.as<float>());
  }
  // The ONNX value of node n's output: its name, unless that is the graph's input or
  // output name.
  static std::string value_name(const PlannedNode& n) {
    return n.name == "input" || n.name == "logits" ? n.name + "/out" : n.name;
  }
  bool has_param(const PlannedNode& n, const std::string& p) const {
    return params_.count(owner(n, p)) > 0;
  }

  // y = activation(x) under the name `out`; `x` itself for NONE.
  std::string activation(pb::Activation kind, const std::string& x, const std::string& out) {
    switch (kind) {
      case pb::NONE:
        return x;
      case pb::RELU:
        return w_.op("Relu", out, {x});
      case pb::GELU: {  // 0.5 x (1 + erf(x / sqrt 2)): opset 17 has no Gelu
        const std::string e =
            w_.op("Erf", out + "/erf",
                  {w_.op("Div", out + "/scaled", {x, w_.scalar("const/sqrt2", float(M_SQRT2))})});
        const std::string one = w_.op("Add", out + "/one_plus", {e, w_.scalar("const/one", 1.f)});
        return w_.op("Mul", out,
                     {w_.op("Mul", out + "/x_times", {x, one}), w_.scalar("const/half", 0.5f)});
      }
      case pb::GELU_TANH: {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's form
        const std::string x3 =
            w_.op("Mul", out + "/cube", {w_.op("Mul", out + "/square", {x, x}), x});
        const std::string inner = w_.op(
            "Add", out + "/inner",
            {x, w_.op("Mul", out + "/cubic", {x3, w_.scalar("const/gelu_cubic", 0.044715f)})});
        const std::string th =
            w_.op("Tanh", out + "/tanh",
                  {w_.op("Mul", out + "/scaled",
                         {inner, w_.scalar("const/sqrt_2_over_pi", 0.7978845608028654f)})});
        const std::string one = w_.op("Add", out + "/one_plus", {th, w_.scalar("const/one", 1.f)});
        return w_.op("Mul", out,
                     {w_.op("Mul", out + "/x_times", {x, one}), w_.scalar("const/half", 0.5f)});
      }
      default:
        throw_input(cat("activation ", pb::Activation_Name(kind), " has no ONNX form"));
    }
  }

  std::string emit(const PlannedNode& n) {
    const pb::Node& d = *n.def;
    const std::string name = value_name(n);
    if (n.op == "linear") return linear(n);
    if (n.op == "conv") {
      const pb::Conv& o = d.conv();
      std::vector<std::string> ins = {in(n, 0), param(n, "weight")};
      if (has_param(n, "bias")) ins.push_back(param(n, "bias"));
      const bool act = o.activation() != pb::NONE;
      const std::string y = act ? name + "/conv" : name;
      auto& c = w_.node("Conv", y, ins, {y});
      const int64_t s = o.has_stride() ? o.stride() : 1;
      GraphWriter::attr(c, "kernel_shape", std::vector<int64_t>{o.kernel(), o.kernel()});
      GraphWriter::attr(c, "strides", std::vector<int64_t>{s, s});
      GraphWriter::attr(c, "pads",
                        std::vector<int64_t>{o.padding(), o.padding(), o.padding(), o.padding()});
      return act ? activation(o.activation(), y, name) : y;
    }
    if (n.op == "batch_norm") {
      auto& b = w_.node("BatchNormalization", name,
                        {in(n, 0), param(n, "weight"), param(n, "bias"), buffer(n, "running_mean"),
                         buffer(n, "running_var")},
                        {name});
      GraphWriter::attr(b, "epsilon",
                        d.batch_norm().has_eps() ? float(d.batch_norm().eps()) : 1e-5f);
      return name;
    }
    if (n.op == "activation") return activation(d.activation().kind(), in(n, 0), name);
    if (n.op == "max_pool") {
      const pb::MaxPool& o = d.max_pool();
      const int64_t s = o.has_stride() ? o.stride() : o.kernel();
      auto& p = w_.node("MaxPool", name, {in(n, 0)}, {name});
      GraphWriter::attr(p, "kernel_shape", std::vector<int64_t>{o.kernel(), o.kernel()});
      GraphWriter::attr(p, "strides", std::vector<int64_t>{s, s});
      return name;
    }
    if (n.op == "global_avg_pool") {  // ONNX keeps [N, C, 1, 1]; ringtrain's is [N, C]
      const std::string p = w_.op("GlobalAveragePool", name + "/pool", {in(n, 0)});
      GraphWriter::attr(w_.node("Flatten", name, {p}, {name}), "axis", int64_t(1));
      return name;
    }
    if (n.op == "dropout") return in(n, 0);  // identity in inference
    if (n.op == "add") {
      std::string acc = in(n, 0);
      for (size_t k = 1; k < n.inputs.size(); ++k)
        acc = w_.op("Add", k + 1 == n.inputs.size() ? name : cat(name, "/sum", k), {acc, in(n, k)});
      return acc;
    }
    if (n.op == "concat") {
      std::vector<std::string> ins;
      for (size_t k = 0; k < n.inputs.size(); ++k) ins.push_back(in(n, k));
      GraphWriter::attr(w_.node("Concat", name, ins, {name}), "axis", int64_t(1));
      return name;
    }
    if (n.op == "flatten") {
      GraphWriter::attr(w_.node("Flatten", name, {in(n, 0)}, {name}), "axis", int64_t(1));
      return name;
    }
    if (n.op == "reshape") {
      std::vector<int64_t> shape = {0};  // 0: the batch dimension as it is
      shape.insert(shape.end(), n.out.begin(), n.out.end());
      return w_.op("Reshape", name, {in(n, 0), w_.ints(name + "/shape", shape)});
    }
    if (n.op == "embedding") return embedding(n);
    if (n.op == "layer_norm") {
      auto& l = w_.node("LayerNormalization", name,
                        {in(n, 0), param(n, "weight"), param(n, "bias")}, {name});
      GraphWriter::attr(l, "axis", int64_t(-1));
      GraphWriter::attr(l, "epsilon",
                        d.layer_norm().has_eps() ? float(d.layer_norm().eps()) : 1e-5f);
      return name;
    }
    if (n.op == "attention") return attention(n);
    throw_input(cat("node '", n.name, "' (op ", n.op,
                    ") cannot be exported to ONNX; exportable ops: linear, conv, batch_norm, "
                    "activation, max_pool, global_avg_pool, dropout, add, concat, flatten, "
                    "reshape, embedding, layer_norm, attention"));
  }

  std::string linear(const PlannedNode& n) {
    const pb::Linear& o = n.def->linear();
    const std::string v = value_name(n);
    const bool bias = has_param(n, "bias");
    const bool act = o.activation() != pb::NONE;
    const std::string y = act ? v + "/linear" : v;
    if (o.last_axis()) {  // [N, ..., in] -> [N, ..., out]: MatMul with W^T, then the bias
      const std::string wt =
          w_.op("Transpose", v + "/weight_t", {param(n, "weight")});  // perm: reversed
      const std::string xw = w_.op("MatMul", bias ? v + "/matmul" : y, {in(n, 0), wt});
      if (bias) w_.op("Add", y, {xw, param(n, "bias")});
    } else {  // x viewed as [N, in_features]
      std::string x = in(n, 0);
      if (n.input_shapes[0].size() != 1) {
        x = v + "/flatten";
        GraphWriter::attr(w_.node("Flatten", x, {in(n, 0)}, {x}), "axis", int64_t(1));
      }
      std::vector<std::string> ins = {x, param(n, "weight")};
      if (bias) ins.push_back(param(n, "bias"));
      GraphWriter::attr(w_.node("Gemm", y, ins, {y}), "transB", int64_t(1));
    }
    return act ? activation(o.activation(), y, v) : y;
  }

  // The first `len` ([1], int64) of dimension 1 of value x: the sequence length T.
  std::string seq_len(const std::string& x, const std::string& prefix) {
    const std::string shape = w_.op("Shape", prefix + "/shape", {x});
    return w_.op(
        "Slice", prefix + "/seq_len",
        {shape, w_.ints("const/i1", {1}), w_.ints("const/i2", {2}), w_.ints("const/i0", {0})});
  }

  // ids [N, T] -> rows of the token table (+ rows 0..T-1 of the position table).
  std::string embedding(const PlannedNode& n) {
    const std::string x = in(n, 0), v = value_name(n);
    const bool positional = !n.def->embedding().has_positional() || n.def->embedding().positional();
    const std::string tok = positional ? v + "/tokens" : v;
    GraphWriter::attr(w_.node("Gather", tok, {param(n, "wte"), x}, {tok}), "axis", int64_t(0));
    if (!positional) return tok;
    const std::string pos =
        w_.op("Slice", v + "/positions",
              {param(n, "wpe"), w_.ints("const/i0", {0}), seq_len(x, v), w_.ints("const/i0", {0})});
    return w_.op("Add", v, {tok, pos});
  }

  // Causal multi-head self-attention as MatMul/Softmax: qkv [N, T, 3C] (q, k, v side by
  // side, head h at columns h*hs of each) -> [N, T, C]; scores scaled by 1/sqrt(hs), the
  // future masked by adding -inf from the top-left [T, T] of one constant mask.
  std::string attention(const PlannedNode& n) {
    const std::string x = in(n, 0), p = value_name(n);
    const int64_t heads = n.def->attention().heads(), c = n.input_shapes[0][1] / 3, hs = c / heads;
    const int64_t l = std::max(mask_size_, n.input_shapes[0][0]);
    if (mask_.empty()) {
      std::vector<float> m(size_t(l * l), 0.f);
      for (int64_t i = 0; i < l; ++i)
        for (int64_t j = i + 1; j < l; ++j)
          m[size_t(i * l + j)] = -std::numeric_limits<float>::infinity();
      mask_ = w_.weight("const/causal_mask", {l, l}, m.data());
      mask_size_ = l;
    }
    auto& split = w_.node("Split", p + "/split", {x, w_.ints(cat("const/split_", c), {c, c, c})},
                          {p + "/q", p + "/k", p + "/v"});
    GraphWriter::attr(split, "axis", int64_t(2));
    const std::string heads_shape = w_.ints(cat("const/heads_", heads, "x", hs), {0, 0, heads, hs});
    auto split_heads = [&](const std::string& v, std::vector<int64_t> perm) {
      const std::string r = w_.op("Reshape", v + "_heads", {v, heads_shape});
      const std::string t = v + "_t";
      GraphWriter::attr(w_.node("Transpose", t, {r}, {t}), "perm", perm);
      return t;
    };
    const std::string q = split_heads(p + "/q", {0, 2, 1, 3});  // [N, H, T, hs]
    const std::string k = split_heads(p + "/k", {0, 2, 3, 1});  // [N, H, hs, T]
    const std::string v = split_heads(p + "/v", {0, 2, 1, 3});  // [N, H, T, hs]
    const std::string s =
        w_.op("Mul", p + "/scores",
              {w_.op("MatMul", p + "/qk", {q, k}),
               w_.scalar(cat("const/inv_sqrt_", hs), 1.f / std::sqrt(float(hs)))});
    const std::string t = seq_len(x, p);
    const std::string ends = p + "/mask_ends";
    GraphWriter::attr(w_.node("Concat", ends, {t, t}, {ends}), "axis", int64_t(0));
    const std::string m =
        w_.op("Slice", p + "/mask",
              {mask_, w_.ints("const/i00", {0, 0}), ends, w_.ints("const/i01", {0, 1})});
    const std::string probs = p + "/probs";
    GraphWriter::attr(w_.node("Softmax", probs, {w_.op("Add", p + "/masked", {s, m})}, {probs}),
                      "axis", int64_t(-1));
    const std::string o = p + "/out_t";
    GraphWriter::attr(w_.node("Transpose", o, {w_.op("MatMul", p + "/out", {probs, v})}, {o}),
                      "perm", std::vector<int64_t>{0, 2, 1, 3});
    return w_.op("Reshape", p, {o, w_.ints(cat("const/merge_", c), {0, 0, c})});
  }

  const ModelPlan& plan_;
  GraphWriter& w_;
  std::map<std::string, Param*> params_;
  std::map<std::string, StateBuffer*> buffers_;
  std::vector<std::string> outs_;
  int64_t mask_size_ = 0;
  std::string mask_;
};

}  // namespace

std::string export_nodes(const ModelPlan& plan, Model& model, GraphWriter& w) {
  return Exporter(plan, model, w).run();
}

}  // namespace ringtrain::launch
