// From a model file to a Model: expansion (repeats, `when`, `set`, name templates), input
// resolution and topological order, shape inference over the whole graph before anything
// is allocated, and the build. Every error is an input error naming FILE:LINE:COLUMN and
// the node.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/model.hpp"
#include "nn/model_file.hpp"

namespace ringtrain {

struct PlannedNode {
  std::string name;
  std::string op;                    // the registry's name ("conv", or a plugin op's type)
  std::shared_ptr<pb::Node> def;     // as expanded: every `set` applied
  const pb::Node* source = nullptr;  // in the ModelFile, for locations
  std::vector<int> inputs;           // indices of earlier nodes; -1: the model input
  std::vector<Shape> input_shapes;
  Shape out;                   // one sample
  double flops = 0;            // forward, one sample
  std::optional<DType> dtype;  // `precision` or --layer-precision
  int repeat_body = -1;        // graph::Raw::repeat_body
};

struct ModelPlan {
  Shape input;
  int64_t classes = 0;
  LossSpec loss;                   // the file's loss block
  Shape target;                    // one sample's /targets shape (empty: labels, or not known)
  std::vector<PlannedNode> nodes;  // in topological order; the last is the output
};

// Needs the input shape and classes (ModelFile::set_data_shape, or a checkpoint's text).
ModelPlan plan_model(const ModelFile& file);
// Plans and builds; the Model's text() is file.normalised(). `flat_buffers`: see Model. With a
// tensor-parallel `group` of more than one rank, the transformer blocks' layers are this
// rank's part (nn/tensor_parallel.hpp).
std::unique_ptr<Model> build_model(const ModelFile& file, DType compute, bool flat_buffers = true,
                                   const TensorParallelGroup* group = nullptr);
// A shipped model (or a model file) with var overrides ({"width", "8"}), for the data shape
// given: what tests, benchmarks and tools build.
std::unique_ptr<Model> build_model(const std::string& name_or_path, const Shape& input,
                                   int64_t classes,
                                   const std::vector<std::pair<std::string, std::string>>& vars,
                                   DType compute, const std::string& layer_precision = {});
// The plan's nodes with their layers and per-node options (init, weight decay, sharing),
// checked against the layers' parameters: what a Model is made of, before its buffers.
std::vector<GraphNode> make_graph_nodes(const ModelFile& file, const ModelPlan& plan);
// Layers of a plan without a Model (no flat buffers): for `model show` and checks.
std::vector<std::unique_ptr<Layer>> build_layers(const ModelPlan& plan);
// "" when the two plans build the same network; else the first node that differs and how
// ("node 'conv2': conv { out_channels: 64 ... } here; conv { out_channels: 32 ... } there",
// with `here_is` and `there_is` naming the two).
std::string first_difference(const ModelPlan& here, const ModelPlan& there,
                             const std::string& here_is = "here",
                             const std::string& there_is = "there");

}  // namespace ringtrain
