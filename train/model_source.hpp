// Where a run's network comes from: the model file or built-in name of `train` (with the
// command line's var overrides and the data's shape), or the model text a checkpoint holds
// (for eval, resume, predict and the other commands that rebuild a trained network, built
// and filled with the checkpoint's parameters and buffers). Plugins are loaded here too,
// before any model is read.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "io/dataset.hpp"
#include "kernels/kernels.hpp"
#include "nn/graph_builder.hpp"
#include "nn/model.hpp"
#include "nn/model_file.hpp"
#include "train/config.hpp"

namespace ringtrain::launch {

// dlopen()s each --plugin library, whose static initialisers register its ops (held until
// dlopen() returns: register_plugin_ops). Input error naming the file and the reason when
// one cannot be loaded (dlerror()), registers no op, registers a name that is taken, or was
// built against another ringtrain. Loading one twice is harmless. No collectives: callers
// run it under run_and_agree(), so a plugin failing on one rank ends every rank with one message.
void load_plugins(const std::vector<std::string>& libs);

// The plugin libraries the model's ops come from, one "OP=LIBRARY" line per op, sorted
// (a checkpoint's `plugins` attribute); "" when every op is built in.
std::string plugins_used(const ModelFile& file);

// The model of `train`: --model (name or file), the var overrides, --layer-precision, and
// the data's sample shape and classes (`data` names the data in messages).
ModelFile load_model_for_run(const std::string& model,
                             const std::vector<TrainConfig::VarOverride>& vars,
                             const std::string& layer_precision, const Shape& sample,
                             int64_t classes, const std::string& data);

// What a language model takes: token ids, when the model input feeds a node whose op reads
// tokens (OpDef::input_kind, as `embedding`); `vocab` and `context` are that op's limits
// (context 0: any length). A model takes images and labels otherwise.
struct TokenInput {
  bool takes_tokens = false;
  int64_t vocab = 0, context = 0;
};
TokenInput token_input_of(const ModelPlan& plan);
// The same for `train`'s --model and var overrides, before the data fixes the input shape:
// a model whose first node is a token op is planned for one token to read its limits.
TokenInput token_input_of_run(const std::string& model,
                              const std::vector<TrainConfig::VarOverride>& vars);

// The model a checkpoint holds: its normalised model text, or (older checkpoints) its model
// JSON mapped to the shipped file. `path` names the checkpoint in messages.
ModelFile model_from_checkpoint(const io::CheckpointMeta& meta, const std::string& path);

// Input error unless the checkpoint's model builds the same network as this run's,
// naming the first node that differs and what to do.
void require_same_model(const ModelFile& run, const ModelFile& checkpoint, const std::string& path);

struct LoadedModel {
  std::unique_ptr<Model> model;
  io::CheckpointMeta meta;  // step, input_mean/input_std, ...
};

// Reads `checkpoint`'s metadata, builds its model in `precision` on `device` and loads the
// parameters and buffers (through host copies on a GPU); the working copy is refreshed.
// Input error naming the op and the library when an op of a plugin the checkpoint records
// (attribute `plugins`) is not loaded.
// Input errors name the checkpoint. No collectives (runs under run_and_agree()).
LoadedModel load_model_from_checkpoint(const std::string& checkpoint, DType precision,
                                       Device device, kernels::Backend& backend);

// Input error naming both files unless `data`'s samples have the model's input shape and
// its classes (when known) are at most the model's outputs.
void require_data_fits(const Model& model, const io::DatasetInfo& data,
                       const std::string& checkpoint);

// The fp32 masters as the checkpoint names them, one view per parameter; and the model's
// buffers (BatchNorm running averages etc.).
std::vector<io::NamedTensor> master_views(Model& model);
std::vector<io::NamedTensor> buffer_views(Model& model);

}  // namespace ringtrain::launch
