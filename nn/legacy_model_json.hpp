// Checkpoints written before model files stored the model as JSON ({"name":"cnn",
// "input":[1,28,28],"classes":10,"dropout":0.25}); this maps such a description to the
// shipped model file with the same vars, so old checkpoints still load.
#pragma once

#include <string>

#include "nn/model_file.hpp"

namespace ringtrain {

// True when `text` is the JSON of an old checkpoint (it starts with '{').
bool is_legacy_model_json(const std::string& text);
// The built-in model file the JSON describes; an input error naming `origin` for JSON that
// is malformed or names a model this ringtrain does not ship.
ModelFile model_file_from_legacy_json(const std::string& json, const std::string& origin);

}  // namespace ringtrain
