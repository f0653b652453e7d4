// `ringtrain export --format onnx`: a checkpoint's network as an ONNX model (opset 17) for
// ONNX Runtime, TensorRT and other serving stacks. The graph is built with the ONNX
// project's own C++ library (libonnx: its generated onnx::ModelProto classes, onnx::checker
// and strict shape inference), from the model the checkpoint's text rebuilds: fp32 masters
// as initialisers under their checkpoint names, BatchNorm in inference form (running
// statistics), dropout removed, input "input" and output "logits" with a dynamic batch
// dimension. Every rank builds and checks the graph (so a failure on any rank is one agreed
// message); rank 0 writes OUT.tmp and renames it to OUT when it is complete. Each op's
// ONNX form is its OpDef's hook (nn/ops/), called by launch/onnx_graph.cpp.
#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "io/output_file.hpp"
#include "launch/commands.hpp"
#include "launch/onnx_graph.hpp"
#include "launch/options.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/config.hpp"
#include "ringtrain/model.pb.h"
#include "train/device.hpp"
#include "train/evaluate.hpp"
#include "train/job.hpp"
#include "train/model_source.hpp"

namespace fs = std::filesystem;

namespace ringtrain::launch {
namespace {

constexpr int64_t kOpset = 17;  // LayerNormalization is new in 17; libonnx 1.12 knows no later

// "batch", "sequence" or a fixed size per dimension of a graph input or output.
void set_value_info(onnx::ValueInfoProto& v, const std::string& name, int elem,
                    const std::vector<std::string>& symbolic, const Shape& fixed,
                    const std::string& doc) {
  v.set_name(name);
  v.set_doc_string(doc);
  onnx::TypeProto_Tensor* t = v.mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem);
  for (const auto& s : symbolic) t->mutable_shape()->add_dim()->set_dim_param(s);
  for (int64_t d : fixed) t->mutable_shape()->add_dim()->set_dim_value(d);
}

// Input error naming the node (and where the file has it) for an op of a plugin
// (`custom`), anywhere in the file, repeats included: checked before the model is built,
// which would need the plugin.
void require_no_custom_ops(const ModelFile& file,
                           const google::protobuf::RepeatedPtrField<pb::Node>& nodes) {
  for (const pb::Node& n : nodes) {
    RT_REQUIRE(!n.has_custom(), file.where(n), ": node '", n.name(), "' (op custom, type '",
               n.custom().type(),
               "', from a plugin) cannot be exported to ONNX; only ringtrain's "
               "built-in ops can");
    if (n.has_repeat()) require_no_custom_ops(file, n.repeat().node());
  }
}

std::string join(const std::vector<double>& v) {
  std::string s;
  char buf[32];
  for (double x : v) {  // every digit: the reader normalises exactly as training did
    std::snprintf(buf, sizeof buf, "%.17g", x);
    s += cat(s.empty() ? "" : ",", buf);
  }
  return s;
}

// The longest sequence a token model takes: the context of its token ops (OpDef::token_limits).
int64_t context_of(const ModelPlan& plan) {
  int64_t c = plan.input[0];
  for (const PlannedNode& n : plan.nodes) {
    const OpDef* op = find_op(n.op);
    if (op && op->token_limits)
      c = std::max(c, op->token_limits({*n.def, n.name, n.input_shapes}).context);
  }
  return c;
}

// The checked ONNX model of a checkpoint (see the file comment).
onnx::ModelProto export_onnx(const std::string& checkpoint) {
  const io::CheckpointMeta meta = io::read_checkpoint_meta(checkpoint);
  ModelFile file = model_from_checkpoint(meta, checkpoint);
  require_no_custom_ops(file, file.def().node());
  const ModelPlan plan = plan_model(file);
  std::unique_ptr<kernels::Backend> backend = make_backend(Device{}, 1, "grow");
  LoadedModel loaded = load_model_from_checkpoint(checkpoint, DType::f32, Device{}, *backend);

  onnx::ModelProto m;
  m.set_ir_version(onnx::IR_VERSION);
  m.set_producer_name("ringtrain");
  m.set_producer_version(RINGTRAIN_VERSION);
  m.set_model_version(meta.step);
  m.set_doc_string(
      cat("ringtrain model '", file.name(), "' from ", checkpoint, " (step ", meta.step, ")"));
  onnx::OperatorSetIdProto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpset);
  onnx::GraphProto& g = *m.mutable_graph();
  g.set_name(file.name());
  GraphWriter w(g);

  // Token models (a token op reads the input) take int32 ids [batch, sequence]; the others
  // the normalised samples [batch, ...].
  const bool tokens = token_input_of(plan).takes_tokens;
  Shape out = plan.nodes.back().out;
  std::vector<std::string> out_sym = {"batch"};
  if (tokens) {
    set_value_info(*g.add_input(), "input", onnx::TensorProto::INT32, {"batch", "sequence"}, {},
                   cat("token ids [batch, sequence], sequence at most the context ",
                       context_of(plan), " (trained with ", plan.input[0], ")"));
    if (!out.empty()) {
      out.erase(out.begin());
      out_sym.push_back("sequence");
    }
  } else {
    set_value_info(*g.add_input(), "input", onnx::TensorProto::FLOAT, {"batch"}, plan.input,
                   "samples normalised as in training: (v / 255 - input_mean[c]) / "
                   "input_std[c] for uint8 pixels, (v - input_mean[c]) / input_std[c] for "
                   "float32 (metadata_props input_mean, input_std: per channel or one value)");
    const io::Normalization norm = normalization_of(meta);
    auto* mean = m.add_metadata_props();
    mean->set_key("input_mean");
    mean->set_value(join(norm.mean));
    auto* std = m.add_metadata_props();
    std->set_key("input_std");
    std->set_value(join(norm.std));
  }
  auto* src = m.add_metadata_props();
  src->set_key("ringtrain_checkpoint_step");
  src->set_value(cat(meta.step));

  const std::string last = export_nodes(plan, *loaded.model, w);
  w.node("Identity", "logits", {last}, {"logits"});
  set_value_info(*g.add_output(), "logits", onnx::TensorProto::FLOAT, out_sym, out,
                 tokens ? "logits [batch, sequence, vocabulary]" : "logits [batch, classes]");

  // What onnx.checker.check_model(m, full_check=True) does: the checker, and strict shape
  // inference with type checks (in place, not on a copy of every weight: the inferred
  // shapes stay in the file as value_info, which runtimes may use). A failure is
  // ringtrain's bug (exit 2), never the user's.
  try {
    onnx::checker::check_model(m);
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(true, 1, false));
    onnx::checker::check_model(m);
  } catch (const std::exception& e) {
    RT_CHECK(false, "the ONNX checker rejects the graph exported from '", checkpoint,
             "': ", e.what());
  }
  // One protobuf message holds at most 2 GiB (ONNX's external-data files are not written).
  RT_REQUIRE(m.ByteSizeLong() <= size_t(INT32_MAX), "checkpoint '", checkpoint, "': the model's ",
             m.ByteSizeLong(), " bytes exceed the 2 GiB one ONNX file can hold");
  return m;
}

void write_model(const onnx::ModelProto& m, const std::string& out) {
  std::string bytes;
  RT_CHECK(m.SerializeToString(&bytes), "serialising the ONNX model for '", out, "' failed");
  io::write_outputs({out}, [&](std::string*) {
    io::write_whole_file(out + ".tmp", {{bytes.data(), bytes.size()}});
  });
}

}  // namespace

int cmd_export(const std::vector<std::string>& args, comm::Communicator& comm) {
  ExportConfig cfg;
  std::string help;
  bool run = true;
  run_and_agree(comm, [&] { run = parse_export(args, cfg, &help); });
  if (!run) {
    if (comm.rank() == 0) std::cout << help;
    return 0;
  }
  if (cfg.format == "hf") {  // rank 0 writes; the others wait for the outcome
    run_and_agree(comm, [&] {
      if (comm.rank() != 0) return;
      std::cout << export_hf(cfg.checkpoint, cfg.out) << "\n" << std::flush;
    });
    return 0;
  }
  onnx::ModelProto model;
  run_and_agree(comm, [&] {
    model = export_onnx(cfg.checkpoint);
    maybe_inject_fault("export");
  });
  run_and_agree(comm, [&] {
    if (comm.rank() != 0) return;
    const fs::path parent = fs::path(cfg.out).parent_path();  // like `mkdir -p`
    std::error_code ec;
    if (!parent.empty()) fs::create_directories(parent, ec);
    RT_REQUIRE(parent.empty() || fs::is_directory(parent), "--out '", cfg.out, "': directory '",
               parent.string(), "' cannot be created", ec ? cat(" (", ec.message(), ")") : "");
    write_model(model, cfg.out);
    std::cout << cat("exported ", cfg.checkpoint, " -> ", cfg.out, " (ONNX opset ", kOpset, ", ",
                     model.graph().node_size(), " nodes, ", model.graph().initializer_size(),
                     " initialisers; input '", model.graph().input(0).name(),
                     "', output 'logits')\n")
              << std::flush;
  });
  return 0;
}

}  // namespace ringtrain::launch
