// `ringtrain convert hf` and `ringtrain export --format hf`: Hugging Face GPT-2 and Llama
// directories (config.json + safetensors) to a ringtrain checkpoint and back (train/hf_weights.hpp
// holds the name mapping). convert: every rank maps the files, reads the flat 1/W-th of each tensor
// it writes (converting and transposing element by element, so no rank holds more than its
// part) and the ranks write the checkpoint together, each its hyperslabs. export: rank 0
// reads the checkpoint one tensor at a time straight into the mapped safetensors file (a
// Conv1D weight through one tensor's buffer, transposed), never building the model.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "io/output_file.hpp"
#include "io/safetensors.hpp"
#include "launch/commands.hpp"
#include "launch/config.hpp"
#include "nn/graph_builder.hpp"
#include "ringtrain/config.hpp"
#include "train/hf_weights.hpp"
#include "train/job.hpp"
#include "train/model_source.hpp"

namespace fs = std::filesystem;

namespace ringtrain::launch {

int convert_hf(const ConvertConfig& cfg, comm::Communicator& comm) {
  std::unique_ptr<HfModel> hf;
  std::vector<Buffer> storage;
  std::vector<io::NamedTensor> parts;
  io::CheckpointMeta meta;
  int64_t total = 0;
  run_and_agree(comm, [&] {
    hf = std::make_unique<HfModel>(cfg.hf_dir);
    const int64_t w = comm.size(), r = comm.rank();
    for (const auto& [name, shape] : model_param_shapes(hf->model_file())) {
      const int64_t n = shape_numel(shape), lo = n * r / w, hi = n * (r + 1) / w;
      total += n;
      storage.emplace_back(size_t(std::max<int64_t>(hi - lo, 1)) * 4, Device{},
                           MemCategory::masters);
      parts.push_back(
          {name, Tensor(storage.back().data(), {hi - lo}, DType::f32, Device{}), shape, lo});
    }
    hf->read(parts);
    const fs::path parent = fs::path(cfg.out).parent_path();
    std::error_code ec;
    if (!parent.empty() && r == 0) fs::create_directories(parent, ec);
    meta.precision = "fp32";
    meta.model = hf->model_file().normalised();
    meta.ringtrain_version = RINGTRAIN_VERSION;
    meta.optimizer = "adamw";
    meta.world_size = w;
  });
  run_and_agree(comm, [&] {
    const fs::path parent = fs::path(cfg.out).parent_path();
    RT_REQUIRE(parent.empty() || fs::is_directory(parent), "--out '", cfg.out, "': directory '",
               parent.string(), "' cannot be created");
  });
  const uint64_t bytes =
      run_or_fail([&] { return io::save_checkpoint_file(comm.mpi(), cfg.out, meta, parts); });
  if (comm.rank() == 0)
    std::cout << cat("converted ", cfg.hf_dir, " -> ", cfg.out, ": ", hf->model_file().name(), " (",
                     parts.size(), " tensors, ", total, " parameters, ", bytes, " bytes; read by ",
                     comm.size(), " rank(s))\n")
              << std::flush;
  return 0;
}

namespace {

// The GPT-2 sizes of a checkpoint's model, an input error naming the first node that differs
// when it is not GPT-2's architecture.
struct Gpt2Sizes {
  int64_t layers, heads, width, context, padded_vocab, classes;
};

Gpt2Sizes gpt2_sizes(const ModelFile& file, const std::string& checkpoint) {
  const ExprScope s = file.scope();
  for (const char* v : {"layers", "heads", "width", "context", "padded_vocab"})
    RT_REQUIRE(s.count(v) && s.at(v).kind == ExprValue::Kind::integer,
               "export --format hf: ", "checkpoint '", checkpoint, "' holds model '", file.name(),
               "', which is not GPT-2's architecture (it has no var '", v,
               "'); Hugging Face export supports the GPT-2 model files (gpt-tiny, gpt2-124m) and "
               "the Llama ones (llama-tiny, llama3-1b)");
  const Gpt2Sizes g{s.at("layers").i,  s.at("heads").i,        s.at("width").i,
                    s.at("context").i, s.at("padded_vocab").i, file.classes()};
  const double dropout = s.count("dropout") ? s.at("dropout").d : 0.0;
  const ModelFile ref = gpt2_model_file(g.layers, g.heads, g.width, g.context, g.padded_vocab,
                                        g.classes, dropout, "GPT-2");
  const std::string diff =
      first_difference(plan_model(file), plan_model(ref), "in the checkpoint", "in GPT-2");
  RT_REQUIRE(diff.empty(), "export --format hf: checkpoint '", checkpoint, "' holds model '",
             file.name(), "', which is not GPT-2's architecture: ", diff);
  return g;
}

// The Llama sizes of a checkpoint's model (llama-tiny's vars), an input error naming the first
// node that differs from llama-tiny's graph at those sizes.
LlamaSizes llama_sizes(const ModelFile& file, const std::string& checkpoint) {
  const ExprScope s = file.scope();
  auto num = [&](const char* v) {
    const ExprValue& x = s.at(v);
    return x.kind == ExprValue::Kind::integer ? double(x.i) : x.d;
  };
  for (const char* v : {"layers", "heads", "kv_heads", "width", "ffn", "context", "padded_vocab"})
    RT_REQUIRE(s.count(v) && s.at(v).kind == ExprValue::Kind::integer,
               "export --format hf: ", "checkpoint '", checkpoint, "' holds model '", file.name(),
               "', which is not Llama's architecture (it has no var '", v, "')");
  for (const char* v : {"rope_theta", "norm_eps"})
    RT_REQUIRE(s.count(v) && (s.at(v).kind == ExprValue::Kind::integer ||
                              s.at(v).kind == ExprValue::Kind::real),
               "export --format hf: checkpoint '", checkpoint, "' holds model '", file.name(),
               "', which is not Llama's architecture (it has no var '", v, "')");
  bool tied = true;
  for (const auto& [name, shape] : model_param_shapes(file))
    if (name == "lm_head.weight") tied = false;
  const LlamaSizes l{s.at("layers").i,
                     s.at("heads").i,
                     s.at("kv_heads").i,
                     s.at("width").i,
                     s.at("ffn").i,
                     s.at("context").i,
                     s.at("padded_vocab").i,
                     file.classes(),
                     num("rope_theta"),
                     num("norm_eps"),
                     tied};
  const ModelFile ref = llama_model_file(l, "Llama");
  const std::string diff =
      first_difference(plan_model(file), plan_model(ref), "in the checkpoint", "in Llama");
  RT_REQUIRE(diff.empty(), "export --format hf: checkpoint '", checkpoint, "' holds model '",
             file.name(), "', which is not Llama's architecture: ", diff);
  return l;
}

}  // namespace

std::string export_hf(const std::string& checkpoint, const std::string& out_dir) {
  const io::CheckpointMeta meta = io::read_checkpoint_meta(checkpoint);
  const ModelFile file = model_from_checkpoint(meta, checkpoint);
  const bool llama = file.scope().count("kv_heads") > 0;
  LlamaSizes l{};
  Gpt2Sizes g{};
  if (llama)
    l = llama_sizes(file, checkpoint);
  else
    g = gpt2_sizes(file, checkpoint);
  const int64_t classes = llama ? l.classes : g.classes;
  // One tensor at a time from the checkpoint: straight into the mapped output, or (Conv1D
  // weights) into one tensor's buffer, transposed into the output.
  std::vector<io::SafetensorsOut> out;
  for (const auto& [name, shape] : model_param_shapes(file)) {
    const HfName h = llama ? llama_hf_name(name) : gpt2_hf_name(name);
    RT_CHECK(!h.name.empty(), "no HF name for '", name, "'");
    if (h.transpose) {  // ringtrain [O, I] -> Conv1D [I, O]
      const int64_t o_dim = shape[0], i_dim = shape[1];
      out.push_back({h.name, {i_dim, o_dim}, [=, &checkpoint](float* dst) {
                       std::vector<float> src(static_cast<size_t>(o_dim * i_dim));
                       io::read_checkpoint_params(
                           checkpoint, {{name, Tensor(src.data(), shape, DType::f32, Device{})}});
                       for (int64_t i = 0; i < i_dim; ++i)
                         for (int64_t o = 0; o < o_dim; ++o)
                           dst[i * o_dim + o] = src[size_t(o * i_dim + i)];
                     }});
    } else {
      Shape s = shape;
      // The vocabulary, without the padded rows.
      if (name == "embed.wte" || name == "embed_tokens.wte" || name == "lm_head.weight")
        s[0] = classes;
      const int64_t n = shape_numel(s);
      // The first n elements of the stored tensor (all of it but the padded rows).
      out.push_back({h.name, s, [=, &checkpoint](float* dst) {
                       io::read_checkpoint_params(
                           checkpoint, {{name, Tensor(dst, {n}, DType::f32, Device{}), shape, 0}});
                     }});
    }
  }
  nlohmann::ordered_json config;
  if (llama)
    config = {{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"vocab_size", l.classes},
              {"hidden_size", l.width},
              {"intermediate_size", l.ffn},
              {"num_hidden_layers", l.layers},
              {"num_attention_heads", l.heads},
              {"num_key_value_heads", l.kv_heads},
              {"hidden_act", "silu"},
              {"max_position_embeddings", l.context},
              {"rms_norm_eps", l.norm_eps},
              {"rope_theta", l.rope_theta},
              {"rope_scaling", nullptr},
              {"attention_bias", false},
              {"attention_dropout", 0.0},
              {"mlp_bias", false},
              {"pretraining_tp", 1},
              {"initializer_range", 0.02},
              {"tie_word_embeddings", l.tied},
              {"use_cache", true},
              {"torch_dtype", "float32"}};
  else
    config = {{"architectures", {"GPT2LMHeadModel"}},
              {"model_type", "gpt2"},
              {"vocab_size", g.classes},
              {"n_positions", g.context},
              {"n_embd", g.width},
              {"n_layer", g.layers},
              {"n_head", g.heads},
              {"n_inner", nullptr},
              {"activation_function", "gelu_new"},
              {"resid_pdrop", 0.0},
              {"embd_pdrop", 0.0},
              {"attn_pdrop", 0.0},
              {"layer_norm_epsilon", 1e-5},
              {"initializer_range", 0.02},
              {"scale_attn_weights", true},
              {"scale_attn_by_inverse_layer_idx", false},
              {"reorder_and_upcast_attn", false},
              {"tie_word_embeddings", true},
              {"use_cache", true},
              {"torch_dtype", "float32"}};
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  RT_REQUIRE(fs::is_directory(out_dir), "--out '", out_dir, "': the directory cannot be created",
             ec ? cat(" (", ec.message(), ")") : "");
  io::write_safetensors((fs::path(out_dir) / "model.safetensors").string(), out);
  const std::string text = config.dump(2) + "\n";
  const std::string config_path = (fs::path(out_dir) / "config.json").string();
  io::write_outputs({config_path}, [&](std::string*) {
    io::write_whole_file(config_path + ".tmp", {{text.data(), text.size()}});
  });
  if (llama)
    return cat("exported ", checkpoint, " -> ", out_dir,
               "/{config.json,model.safetensors} (Llama: ", l.layers, " layers, ", l.heads,
               " heads, ", l.kv_heads, " kv heads, width ", l.width, ", ffn ", l.ffn, ", context ",
               l.context, ", vocabulary ", l.classes, l.tied ? ", head tied" : ", head untied",
               "; ", out.size(), " tensors)");
  return cat("exported ", checkpoint, " -> ", out_dir,
             "/{config.json,model.safetensors} (GPT-2: ", g.layers, " layers, ", g.heads,
             " heads, width ", g.width, ", context ", g.context, ", vocabulary ", g.classes, "; ",
             out.size(), " tensors)");
}

}  // namespace ringtrain::launch
