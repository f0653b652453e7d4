// --init-from CKPT|HF_DIR: a fresh run (step 0, fresh optimizer state, the run's own schedule
// and data order) whose weights come from a ringtrain checkpoint or a Hugging Face GPT-2
// directory. The source's model must build the same tensors (names and shapes) as the run's;
// the one exception is the run's last node (the head) when the number of classes differs: its
// tensors keep their fresh initialisation, and the first lines say so. Distinct from --resume,
// which continues a run (optimizer state, step, data position).
#include <filesystem>
#include <map>

#include "nn/graph_builder.hpp"
#include "train/hf_weights.hpp"
#include "train/model_source.hpp"
#include "train/trainer.hpp"

namespace ringtrain::launch {
namespace {

// The train options that build `src`'s model: --model and a --set per var ("--model
// gpt2-124m --set layers=2 ..."), for messages. `base`: the model file it was made from.
std::string model_options(const ModelFile& src, const std::string& base) {
  std::string out = cat("--model ", base);
  const ExprScope scope = src.scope();
  for (const std::string& v : src.var_names()) {
    const auto it = scope.find(v);
    if (it == scope.end()) continue;
    const ExprValue& x = it->second;
    if (x.kind == ExprValue::Kind::integer) out += cat(" --set ", v, "=", x.i);
    if (x.kind == ExprValue::Kind::real) out += cat(" --set ", v, "=", x.d);
    if (x.kind == ExprValue::Kind::string) out += cat(" --set ", v, "=", x.s);
    if (x.kind == ExprValue::Kind::list && !x.list.empty()) {
      out += cat(" --set ", v, "=", x.list[0]);
      for (size_t i = 1; i < x.list.size(); ++i) out += cat(",", x.list[i]);
    }
  }
  return out;
}

}  // namespace

void Trainer::init_weights_from(const std::string& source) {
  const bool hf_dir = is_hf_dir(source);
  std::unique_ptr<HfModel> hf;
  std::unique_ptr<ModelFile> theirs;
  if (hf_dir) {
    hf = std::make_unique<HfModel>(source);
  } else {
    RT_REQUIRE(std::filesystem::is_regular_file(source), "--init-from '", source,
               "' is neither a ringtrain checkpoint file nor a Hugging Face model directory "
               "(config.json + model.safetensors)");
    std::string why;
    RT_REQUIRE(io::validate_checkpoint(source, &why), "--init-from '", source,
               "' is not a usable checkpoint: ", why);
    theirs = std::make_unique<ModelFile>(
        model_from_checkpoint(io::read_checkpoint_meta(source), source));
  }
  const ModelFile& src = hf ? hf->model_file() : *theirs;
  const std::string same = cat("; initialise from a checkpoint of the same model (", src.name(),
                               ": ", model_options(src, hf ? hf->base_model() : src.name()), ")");
  std::map<std::string, Shape> src_shapes;
  for (auto& [name, shape] : model_param_shapes(src)) src_shapes[name] = shape;
  const std::string head = plan_model(*model_file_).nodes.back().name;
  std::vector<std::string> replaced;
  std::map<std::string, bool> read;  // run's tensor -> read from the source
  for (auto& [name, shape] : model_param_shapes(*model_file_)) {
    const auto it = src_shapes.find(name);
    RT_REQUIRE(it != src_shapes.end(), "--init-from '", source, "' holds model '", src.name(),
               "', which has no tensor '", name, "' of this run's model '", model_file_->name(),
               "' (", shape_str(shape), ")", same);
    // A Hugging Face vocabulary padded to this run's embedding rows (the rows beyond it zero,
    // as llm.c pads GPT-2's 50257 to 50304).
    const bool padded = hf && hf->padded_rows(name) && shape.size() == 2 &&
                        it->second.size() == 2 && shape[1] == it->second[1] &&
                        shape[0] >= it->second[0];
    if (it->second != shape && !padded) {
      const bool in_head = name.starts_with(head + ".");
      RT_REQUIRE(in_head, "--init-from '", source, "': tensor '", name, "' is ",
                 shape_str(it->second), " there but ", shape_str(shape), " in this run's model '",
                 model_file_->name(), "'; only the last node ('", head,
                 "', the head) may differ, when the number of classes does", same);
      replaced.push_back(cat(name, " ", shape_str(it->second), " -> ", shape_str(shape)));
    }
    read[name] = it->second == shape || padded;
    src_shapes.erase(it);
  }
  RT_REQUIRE(src_shapes.empty(), "--init-from '", source, "' holds model '", src.name(),
             "' with tensor '", src_shapes.begin()->first, "' ",
             shape_str(src_shapes.begin()->second), ", which this run's model '",
             model_file_->name(), "' does not have", same);

  auto pick = [&](const std::vector<io::NamedTensor>& views) {
    std::vector<io::NamedTensor> out;
    for (const auto& v : views)
      if (read.at(v.name)) out.push_back(v);
    return out;
  };
  auto load = [&](const std::vector<io::NamedTensor>& params,
                  const std::vector<io::NamedTensor>& buffers) {
    if (hf) {
      hf->read(pick(params));
    } else {
      io::read_checkpoint_params(source, pick(params));
      io::read_checkpoint_buffers(source, buffers);
    }
  };
  if (host_) {
    host_->download();  // the fresh values of a replaced head
    load(host_->params, host_->buffers);
    host_->upload();
  } else {
    load(strategy_->param_views(), buffer_views(*model_));
  }
  model_->refresh_working_copy(*backend_);
  resumed_from_ =
      cat("initialised from ", source, hf ? cat(" (Hugging Face ", hf->arch_name(), ")") : "",
          ": weights only (step 0, fresh optimizer state)");
  if (!replaced.empty()) {
    resumed_from_ += cat("; head '", head, "' replaced (classes differ), freshly initialised:");
    for (const auto& r : replaced) resumed_from_ += " " + r;
  }
  if (!cfg_.freeze.empty()) {
    resumed_from_ += "; frozen:";
    for (const auto& f : cfg_.freeze) resumed_from_ += cat(" ", f, "*");
  }
}

}  // namespace ringtrain::launch
