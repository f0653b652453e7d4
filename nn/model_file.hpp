// ModelFile: a model file (protobuf text format against proto/ringtrain/model.proto) as
// parsed, with the source locations of its messages for error messages, its vars and their
// command-line overrides, the run's input shape and classes, and the normalised text that
// checkpoints store. Built-in names (mlp, cnn, resnet) are the shipped models/*.pbtxt.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "nn/expr.hpp"

#include <google/protobuf/text_format.h>

namespace ringtrain {

namespace pb {
class Model;
class Node;
}  // namespace pb

// Bounds on a model file (docs/models.md, "Limits"): its size on disk, and how deeply its
// messages nest (a repeat's body is two levels below the repeat's node).
inline constexpr uint64_t kMaxModelFileBytes = 64ull << 20;
inline constexpr int kMaxMessageNesting = 100;

class ModelFile {
 public:
  // Parses `text`; `origin` names it in messages (a path, or "checkpoint F"). Syntax
  // errors, unknown fields and a wrong format_version are input errors with
  // ORIGIN:LINE:COLUMN.
  static ModelFile parse(const std::string& text, const std::string& origin);
  // A built-in name (builtin_models()) or a path to a model file.
  static ModelFile load(const std::string& name_or_path);
  static std::vector<std::string> builtin_models();
  static bool is_builtin(const std::string& name);

  ModelFile(ModelFile&&) noexcept;
  ModelFile& operator=(ModelFile&&) noexcept;
  ~ModelFile();

  const std::string& origin() const { return origin_; }
  const pb::Model& def() const { return *def_; }
  // Model name: the file's `name`, else the built-in name or the file's stem.
  std::string name() const;

  bool has_var(const std::string& var) const;
  std::vector<std::string> var_names() const;
  // Sets a var from command-line text; `option` names the source in messages ("--width").
  // Input error when the file has no such var or the value is of the wrong type or range.
  void override_var(const std::string& var, const std::string& value, const std::string& option);
  // The overrides applied, as the user wrote them ("--hidden 64,32"), for messages.
  const std::vector<std::string>& overrides() const { return overrides_; }
  // The vars' values (and `classes`): the scope of the file's expressions.
  ExprScope scope() const;

  // The sample shape and class count of the data; an input error when the file states
  // others. `data` names the data in messages.
  void set_data_shape(const Shape& sample, int64_t classes, const std::string& data);
  Shape input_shape() const;
  int64_t classes() const;
  // One sample's shape of the data's /targets (empty: labels, or not known yet); an input
  // error when the file states another.
  void set_target_shape(const Shape& target, const std::string& data);
  Shape target_shape() const;
  // --layer-precision LIST ("conv1=fp32,stage2=bf16"), checked when the model is built.
  void add_layer_precision(const std::string& list);

  // The model as text in canonical form (protobuf's printer, vars at their values, input
  // shape and classes filled in): equal models give equal text.
  std::string normalised() const;

  // "ORIGIN:LINE:COLUMN" of a message of this file (a node, a var, a set), or of its field
  // `field` (element `index` of a repeated one) when given and present.
  std::string where(const google::protobuf::Message& msg, const std::string& field = {},
                    int index = -1) const;

 private:
  ModelFile();
  void index_locations(const google::protobuf::Message& msg,
                       const google::protobuf::TextFormat::ParseInfoTree* tree);

  std::string origin_, builtin_;
  std::vector<std::string> overrides_;
  std::unique_ptr<pb::Model> def_;
  std::unique_ptr<google::protobuf::TextFormat::ParseInfoTree> tree_;
  // Each parsed message's tree of field locations, and its own start.
  struct Loc {
    const google::protobuf::TextFormat::ParseInfoTree* tree;
    int line, column;
  };
  std::map<const google::protobuf::Message*, Loc> locs_;
};

}  // namespace ringtrain
