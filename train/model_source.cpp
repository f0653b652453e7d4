// The model of a run or of a checkpoint, and the plugins that add ops (model_source.hpp).
#include "train/model_source.hpp"

#include <dlfcn.h>

#include <climits>
#include <cstdlib>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "io/checkpoint.hpp"
#include "nn/legacy_model_json.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/model.pb.h"
#include "train/device.hpp"

namespace ringtrain::launch {

void load_plugins(const std::vector<std::string>& libs) {
  // The handles of the libraries loaded so far: dlopen() of one already loaded returns its
  // handle again without running its initialisers, which is not "registers no op".
  static std::set<void*> loaded;
  for (const auto& lib : libs) {
    // A path without a slash would be searched for in the library path: make it relative.
    const std::string path = lib.find('/') == std::string::npos ? "./" + lib : lib;
    begin_plugin_registrations();
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
      cancel_plugin_registrations();
      const char* why = dlerror();
      throw_input(cat("--plugin '", lib, "' cannot be loaded: ", why ? why : "unknown error",
                      " (expected a shared library built against this ringtrain; "
                      "docs/models.md#extending-in-c)"));
    }
    if (!loaded.insert(handle).second) {
      cancel_plugin_registrations();
      continue;
    }
    // Recorded (checkpoints' `plugins`) by absolute path, so that a message can say which
    // library to pass wherever eval or resume runs from.
    char abs[PATH_MAX];
    register_plugin_ops(realpath(path.c_str(), abs) ? std::string(abs) : lib);
  }
}

ModelFile load_model_for_run(const std::string& model,
                             const std::vector<TrainConfig::VarOverride>& vars,
                             const std::string& layer_precision, const Shape& sample,
                             int64_t classes, const std::string& data) {
  ModelFile f = ModelFile::load(model);
  for (const auto& v : vars) f.override_var(v.var, v.value, v.option);
  f.set_data_shape(sample, classes, data);
  f.add_layer_precision(layer_precision);
  plan_model(f);  // every error of the file now, before anything is allocated
  return f;
}

std::vector<io::NamedTensor> master_views(Model& model) {
  std::vector<io::NamedTensor> views;
  for (auto& p : model.params()) views.push_back({p.name, p.master});
  return views;
}

std::vector<io::NamedTensor> buffer_views(Model& model) {
  std::vector<io::NamedTensor> views;
  for (auto& b : model.buffers()) views.push_back({b.name, b.value});
  return views;
}

std::string plugins_used(const ModelFile& file) {
  std::set<std::string> lines;
  for (const PlannedNode& pn : plan_model(file).nodes)
    if (!op_plugin(pn.op).empty()) lines.insert(cat(pn.op, "=", op_plugin(pn.op)));
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

namespace {

// Input error naming the op and the library when an op of a plugin the checkpoint records
// is not loaded (before the model text would fail as an unknown op).
void require_plugins_loaded(const io::CheckpointMeta& meta, const std::string& path) {
  std::istringstream plugins(meta.plugins);
  for (std::string line; std::getline(plugins, line);) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string op = line.substr(0, eq), lib = line.substr(eq + 1);
    RT_REQUIRE(find_op(op), "checkpoint '", path, "' holds a model with op '", op, "' of plugin '",
               lib, "', which is not loaded; pass --plugin ", lib,
               " (or the same library from another place)");
  }
}

}  // namespace
TokenInput token_input_of(const ModelPlan& plan) {
  for (const auto& n : plan.nodes) {
    const OpDef* op = find_op(n.op);
    if (!op || op->input_kind != InputKind::tokens || n.inputs != std::vector<int>{-1}) continue;
    const TokenLimits l =
        op->token_limits ? op->token_limits({*n.def, n.name, n.input_shapes}) : TokenLimits{};
    return {true, l.vocab, l.context};
  }
  return {};
}

TokenInput token_input_of_run(const std::string& model,
                              const std::vector<TrainConfig::VarOverride>& vars) {
  ModelFile f = ModelFile::load(model);
  if (f.def().node_size() == 0) return {};
  const OpDef* first = op_of(f.def().node(0));
  if (!first || first->input_kind != InputKind::tokens) return {};
  for (const auto& v : vars) f.override_var(v.var, v.value, v.option);
  // One token and two classes fit any language model; a shape or class count the file
  // states is kept (the data is checked against it when the model is built for the run).
  const Shape declared = f.input_shape();
  f.set_data_shape(declared.empty() ? Shape{1} : declared, f.classes() ? f.classes() : 2,
                   "the probe for its input");
  return token_input_of(plan_model(f));
}

ModelFile model_from_checkpoint(const io::CheckpointMeta& meta, const std::string& path) {
  const std::string origin = cat("checkpoint '", path, "' (model attribute)");
  if (is_legacy_model_json(meta.model)) return model_file_from_legacy_json(meta.model, origin);
  return ModelFile::parse(meta.model, origin);
}

void require_same_model(const ModelFile& run, const ModelFile& checkpoint,
                        const std::string& path) {
  const std::string diff =
      first_difference(plan_model(run), plan_model(checkpoint), "in this run", "in the checkpoint");
  RT_REQUIRE(diff.empty(), "checkpoint '", path, "' holds another model than this run builds (",
             run.origin(), "): ", diff,
             "; use the same --model and options, another --checkpoint-dir, or --resume never "
             "--overwrite");
}

LoadedModel load_model_from_checkpoint(const std::string& checkpoint, DType precision,
                                       Device device, kernels::Backend& backend) {
  LoadedModel out;
  out.meta = io::read_checkpoint_meta(checkpoint);
  require_plugins_loaded(out.meta, checkpoint);
  const ModelFile file = model_from_checkpoint(out.meta, checkpoint);
  {
    DeviceScope on_device(device);
    out.model = build_model(file, precision);
  }
  if (device.kind == Device::cpu) {
    io::read_checkpoint_params(checkpoint, master_views(*out.model));
    io::read_checkpoint_buffers(checkpoint, buffer_views(*out.model));
  } else {  // read into host copies, then upload
    HostMirror host(*out.model, nullptr);
    io::read_checkpoint_params(checkpoint, host.params);
    io::read_checkpoint_buffers(checkpoint, host.buffers);
    host.upload();
  }
  out.model->refresh_working_copy(backend);
  return out;
}

void require_data_fits(const Model& model, const io::DatasetInfo& data,
                       const std::string& checkpoint) {
  RT_REQUIRE(model.input_shape() == data.sample_shape, "--data '", data.path,
             "' has samples of shape ", shape_str(data.sample_shape), " but checkpoint '",
             checkpoint, "' holds a model for ", shape_str(model.input_shape()));
  RT_REQUIRE(data.num_classes <= model.classes(), "--data '", data.path, "' has ", data.num_classes,
             " classes but the model of checkpoint '", checkpoint, "' predicts ", model.classes());
}

}  // namespace ringtrain::launch
