// Where a run's network comes from: the model file or built-in name of `train` (with the
// command line's var overrides and the data's shape), or the model text a checkpoint holds
// (for eval, resume, and the commands that rebuild a trained network). Plugins are loaded
// here too, before any model is read.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "launch/config.hpp"
#include "nn/graph_builder.hpp"
#include "nn/model_file.hpp"

namespace ringtrain::io {
struct CheckpointMeta;
}

namespace ringtrain::launch {

// dlopen()s each --plugin library, whose static initialisers register its ops. Input error
// naming the file and dlerror() when one cannot be loaded. Loading one twice is harmless.
void load_plugins(const std::vector<std::string>& libs);

// The model of `train`: --model (name or file), the var overrides, --layer-precision, and
// the data's sample shape and classes (`data` names the data in messages).
ModelFile load_model_for_run(const std::string& model,
                             const std::vector<TrainConfig::VarOverride>& vars,
                             const std::string& layer_precision, const Shape& sample,
                             int64_t classes, const std::string& data);

// The model a checkpoint holds: its normalised model text, or (older checkpoints) its model
// JSON mapped to the shipped file. `path` names the checkpoint in messages.
ModelFile model_from_checkpoint(const io::CheckpointMeta& meta, const std::string& path);

// Input error unless the checkpoint's model builds the same network as this run's,
// naming the first node that differs and what to do.
void require_same_model(const ModelFile& run, const ModelFile& checkpoint, const std::string& path);

}  // namespace ringtrain::launch
