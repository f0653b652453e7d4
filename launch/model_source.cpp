// The model of a run or of a checkpoint, and the plugins that add ops (model_source.hpp).
#include "launch/model_source.hpp"

#include <dlfcn.h>

#include "core/error.hpp"
#include "io/checkpoint.hpp"
#include "launch/device.hpp"
#include "launch/trainer.hpp"
#include "nn/legacy_model_json.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain::launch {

void load_plugins(const std::vector<std::string>& libs) {
  for (const auto& lib : libs) {
    // A path without a slash would be searched for in the library path: make it relative.
    const std::string path = lib.find('/') == std::string::npos ? "./" + lib : lib;
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
      const char* why = dlerror();
      throw_input(cat("--plugin '", lib, "' cannot be loaded: ", why ? why : "unknown error",
                      " (a shared library built against this ringtrain, docs/models.md)"));
    }
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

TokenInput token_input_of(const ModelPlan& plan) {
  for (const auto& n : plan.nodes) {
    if (n.op != "embedding" || n.inputs != std::vector<int>{-1}) continue;
    const auto& e = n.def->embedding();
    const bool positional = !e.has_positional() || e.positional();
    return {true, e.vocab_size(), positional ? e.context() : 0};
  }
  return {};
}

TokenInput token_input_of_run(const std::string& model,
                              const std::vector<TrainConfig::VarOverride>& vars) {
  ModelFile f = ModelFile::load(model);
  if (f.def().node_size() == 0 || !f.def().node(0).has_embedding()) return {};
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
