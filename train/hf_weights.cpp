// Hugging Face GPT-2 directories as ringtrain models and weights (see hf_weights.hpp).
#include "train/hf_weights.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "nn/graph_builder.hpp"

namespace fs = std::filesystem;

namespace ringtrain::launch {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  RT_REQUIRE(in, "cannot read '", path, "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw_input(cat("'", path, "' is not JSON: ", e.what()));
  }
}

// An integer key of config.json (`fallback` keys tried in order), an input error when absent.
int64_t config_int(const nlohmann::json& c, const std::string& path,
                   std::initializer_list<const char*> keys, const char* arch = "GPT-2") {
  for (const char* k : keys)
    if (c.contains(k) && !c[k].is_null()) {
      RT_REQUIRE(c[k].is_number_integer() && c[k].get<int64_t>() > 0, "'", path, "': ", k, " is ",
                 c[k].dump(), "; expected a positive integer");
      return c[k].get<int64_t>();
    }
  throw_input(cat("'", path, "' lacks ", *keys.begin(), " (a ", arch, " config states it)"));
}

void replace_first(std::string& s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  RT_CHECK(at != std::string::npos, "'", from, "' not in the model text");
  s.replace(at, from.size(), to);
}

}  // namespace

bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec);
}

ModelFile gpt2_model_file(int64_t layers, int64_t heads, int64_t width, int64_t context,
                          int64_t padded_vocab, int64_t classes, double dropout,
                          const std::string& origin) {
  ModelFile f = ModelFile::load("gpt2-124m");
  f.override_var("layers", cat(layers), cat(origin, " layers"));
  f.override_var("heads", cat(heads), cat(origin, " heads"));
  f.override_var("width", cat(width), cat(origin, " width"));
  f.override_var("context", cat(context), cat(origin, " context"));
  f.override_var("padded_vocab", cat(padded_vocab), cat(origin, " vocabulary"));
  char d[32];
  std::snprintf(d, sizeof d, "%.17g", dropout);
  f.override_var("dropout", d, cat(origin, " dropout"));
  f.set_data_shape({context}, classes, origin);
  std::string text = f.normalised();
  replace_first(text, "name: \"gpt2-124m\"", "name: \"gpt2\"");
  const size_t at = text.find("description: \"");
  if (at != std::string::npos) {
    const size_t end = text.find('\n', at);
    text.replace(at, end - at,
                 cat("description: \"GPT-2 (GPT2LMHeadModel): ", layers, " layers, ", heads,
                     " heads, width ", width, ", context ", context, ", vocabulary ", classes,
                     padded_vocab != classes ? cat(" padded to ", padded_vocab) : "", "\""));
  }
  return ModelFile::parse(text, origin);
}

ModelFile llama_model_file(const LlamaSizes& s, const std::string& origin) {
  ModelFile f = ModelFile::load("llama-tiny");
  auto real = [](double v) {
    char d[32];
    std::snprintf(d, sizeof d, "%.17g", v);
    return std::string(d);
  };
  f.override_var("layers", cat(s.layers), cat(origin, " layers"));
  f.override_var("heads", cat(s.heads), cat(origin, " heads"));
  f.override_var("kv_heads", cat(s.kv_heads), cat(origin, " kv_heads"));
  f.override_var("width", cat(s.width), cat(origin, " width"));
  f.override_var("ffn", cat(s.ffn), cat(origin, " ffn"));
  f.override_var("context", cat(s.context), cat(origin, " context"));
  f.override_var("padded_vocab", cat(s.padded_vocab), cat(origin, " vocabulary"));
  f.override_var("rope_theta", real(s.rope_theta), cat(origin, " rope_theta"));
  f.override_var("norm_eps", real(s.norm_eps), cat(origin, " norm_eps"));
  f.set_data_shape({s.context}, s.classes, origin);
  std::string text = f.normalised();
  replace_first(text, "name: \"llama-tiny\"", "name: \"llama\"");
  const size_t at = text.find("description: \"");
  if (at != std::string::npos) {
    const size_t end = text.find('\n', at);
    text.replace(at, end - at,
                 cat("description: \"Llama (LlamaForCausalLM): ", s.layers, " layers, ", s.heads,
                     " heads, ", s.kv_heads, " kv heads, width ", s.width, ", ffn ", s.ffn,
                     ", context ", s.context, ", vocabulary ", s.classes,
                     s.padded_vocab != s.classes ? cat(" padded to ", s.padded_vocab) : "",
                     s.tied ? ", head tied" : "", "\""));
  }
  if (s.tied) {
    // lm_head's own weight becomes the embedding's.
    const size_t head = text.find("name: \"lm_head\"");
    RT_CHECK(head != std::string::npos, "no lm_head in llama-tiny");
    const size_t init = text.find("init {", head);
    RT_CHECK(init != std::string::npos, "lm_head of llama-tiny has no init");
    size_t end = init + 6;  // past "init {"; to its closing brace
    for (int depth = 1; depth > 0; ++end) {
      RT_CHECK(end < text.size(), "unbalanced init of lm_head");
      depth += text[end] == '{' ? 1 : text[end] == '}' ? -1 : 0;
    }
    text.replace(init, end - init, "share { param: \"weight\" from: \"embed_tokens.wte\" }");
  }
  return ModelFile::parse(text, origin);
}

std::vector<std::pair<std::string, Shape>> model_param_shapes(const ModelFile& file) {
  const ModelPlan plan = plan_model(file);
  std::vector<std::pair<std::string, Shape>> out;
  for (const GraphNode& n : make_graph_nodes(file, plan))
    for (const ParamSpec& ps : n.layer->param_specs())
      if (!n.shared.count(ps.name)) out.push_back({n.layer->name() + "." + ps.name, ps.shape});
  return out;
}

HfName gpt2_hf_name(const std::string& rt) {
  static const std::map<std::string, HfName> top = {
      {"embed.wte", {"transformer.wte.weight", false}},
      {"embed.wpe", {"transformer.wpe.weight", false}},
      {"ln_f.weight", {"transformer.ln_f.weight", false}},
      {"ln_f.bias", {"transformer.ln_f.bias", false}}};
  if (const auto it = top.find(rt); it != top.end()) return it->second;
  static const std::regex block(R"(block(\d+)\.(ln1|ln2|qkv|attn_proj|fc|fc_proj)\.(weight|bias))");
  static const std::map<std::string, std::string> part = {
      {"ln1", "ln_1"},        {"ln2", "ln_2"},
      {"qkv", "attn.c_attn"}, {"attn_proj", "attn.c_proj"},
      {"fc", "mlp.c_fc"},     {"fc_proj", "mlp.c_proj"}};
  std::smatch m;
  if (!std::regex_match(rt, m, block)) return {};
  const bool conv1d = m[2] != "ln1" && m[2] != "ln2";
  return {cat("transformer.h.", m[1], ".", part.at(m[2]), ".", m[3]), conv1d && m[3] == "weight"};
}

HfName llama_hf_name(const std::string& rt) {
  if (rt == "embed_tokens.wte") return {"model.embed_tokens.weight", false};
  if (rt == "lm_head.weight") return {"lm_head.weight", false};
  if (rt == "norm.weight") return {"model.norm.weight", false};
  static const std::regex layer(
      R"(layers\.\d+\.(input_layernorm|post_attention_layernorm|self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight)");
  if (!std::regex_match(rt, layer)) return {};
  return {"model." + rt, false};
}

// LlamaForCausalLM's config.json: the sizes, and a refusal naming each key whose value the
// llama-tiny graph does not compute.
void HfModel::read_llama_config(const nlohmann::json& c, const std::string& path) {
  layers_ = config_int(c, path, {"num_hidden_layers"}, "Llama");
  const int64_t heads = config_int(c, path, {"num_attention_heads"}, "Llama");
  const int64_t kv_heads = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                               ? config_int(c, path, {"num_key_value_heads"}, "Llama")
                               : heads;
  const int64_t width = config_int(c, path, {"hidden_size"}, "Llama");
  const int64_t ffn = config_int(c, path, {"intermediate_size"}, "Llama");
  const int64_t context = config_int(c, path, {"max_position_embeddings"}, "Llama");
  const int64_t vocab = config_int(c, path, {"vocab_size"}, "Llama");
  RT_REQUIRE(width % heads == 0, "'", path, "': hidden_size ", width,
             " does not divide by num_attention_heads ", heads);
  RT_REQUIRE(heads % kv_heads == 0, "'", path, "': num_attention_heads ", heads,
             " does not divide by num_key_value_heads ", kv_heads);
  auto require = [&](const char* key, bool ok, const std::string& expected) {
    RT_REQUIRE(ok, "'", path, "': ", key, " ", c.contains(key) ? c[key].dump() : "",
               " is not supported; ringtrain's Llama has ", expected);
  };
  auto real = [&](const char* key, double fallback) {
    if (!c.contains(key) || c[key].is_null()) return fallback;
    require(key, c[key].is_number() && c[key].get<double>() > 0, "a positive number");
    return c[key].get<double>();
  };
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (c.contains(key)) require(key, c[key] == false, "no biases in its linear layers (false)");
  if (c.contains("rope_scaling"))
    require("rope_scaling", c["rope_scaling"].is_null(),
            "unscaled rotary embeddings (rope_scaling null)");
  if (c.contains("hidden_act"))
    require("hidden_act", c["hidden_act"] == "silu", "the SiLU-gated MLP (hidden_act silu)");
  if (c.contains("head_dim") && !c["head_dim"].is_null())
    require("head_dim",
            c["head_dim"].is_number_integer() && c["head_dim"].get<int64_t>() == width / heads,
            cat("head_dim = hidden_size / num_attention_heads (", width / heads, ")"));
  const double theta = real("rope_theta", 10000.0), eps = real("rms_norm_eps", 1e-6);
  require("rms_norm_eps", eps <= 1, "rms_norm_eps at most 1");
  bool tied = false;  // LlamaConfig's default
  if (c.contains("tie_word_embeddings")) {
    require("tie_word_embeddings", c["tie_word_embeddings"].is_boolean(), "true or false");
    tied = c["tie_word_embeddings"].get<bool>();
  }
  file_ = std::make_unique<ModelFile>(llama_model_file(
      {layers_, heads, kv_heads, width, ffn, context, vocab, vocab, theta, eps, tied}, path));
}

HfModel::HfModel(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  RT_REQUIRE(fs::is_directory(dir, ec), "Hugging Face model directory '", dir,
             "' does not exist or is not a directory");
  const std::string config_path = (fs::path(dir) / "config.json").string();
  RT_REQUIRE(fs::exists(config_path, ec), "'", dir,
             "' has no config.json; expected a Hugging Face model directory (config.json and "
             "model.safetensors, as save_pretrained writes)");
  const nlohmann::json c = read_json(config_path);
  RT_REQUIRE(c.is_object(), "'", config_path, "' is not a JSON object");
  const std::string type = c.contains("model_type") && c["model_type"].is_string()
                               ? c["model_type"].get<std::string>()
                               : std::string("(none)");
  RT_REQUIRE(type == "gpt2" || type == "llama", "'", config_path, "': model_type '", type,
             "' is not an architecture ringtrain converts; expected gpt2 (GPT2LMHeadModel) or "
             "llama (LlamaForCausalLM)");
  llama_ = type == "llama";
  arch_name_ = llama_ ? "Llama" : "GPT-2";
  base_model_ = llama_ ? "llama-tiny" : "gpt2-124m";
  if (llama_)
    read_llama_config(c, config_path);
  else {
    layers_ = config_int(c, config_path, {"n_layer", "num_hidden_layers"});
    const int64_t heads = config_int(c, config_path, {"n_head", "num_attention_heads"});
    const int64_t width = config_int(c, config_path, {"n_embd", "hidden_size"});
    const int64_t context = config_int(c, config_path, {"n_positions", "n_ctx"});
    const int64_t vocab = config_int(c, config_path, {"vocab_size"});
    RT_REQUIRE(width % heads == 0, "'", config_path, "': n_embd ", width,
               " does not divide by n_head ", heads);
    // What the GPT-2 model file computes; any other setting would give other logits.
    auto require = [&](const char* key, bool ok, const std::string& expected) {
      RT_REQUIRE(ok, "'", config_path, "': ", key, " ", c.contains(key) ? c[key].dump() : "",
                 " is not supported; ringtrain's GPT-2 has ", expected);
    };
    if (c.contains("n_inner") && !c["n_inner"].is_null())
      require("n_inner",
              c["n_inner"].is_number_integer() && c["n_inner"].get<int64_t>() == 4 * width,
              "n_inner = 4 * n_embd (or null)");
    if (c.contains("activation_function"))
      require(
          "activation_function",
          c["activation_function"] == "gelu_new" || c["activation_function"] == "gelu_pytorch_tanh",
          "the tanh GELU (gelu_new)");
    if (c.contains("layer_norm_epsilon"))
      require("layer_norm_epsilon",
              c["layer_norm_epsilon"].is_number() &&
                  float(c["layer_norm_epsilon"].get<double>()) == 1e-5f,
              "layer_norm_epsilon 1e-05");
    if (c.contains("scale_attn_weights"))
      require("scale_attn_weights", c["scale_attn_weights"] == true, "scale_attn_weights true");
    if (c.contains("scale_attn_by_inverse_layer_idx"))
      require("scale_attn_by_inverse_layer_idx", c["scale_attn_by_inverse_layer_idx"] == false,
              "scale_attn_by_inverse_layer_idx false");
    if (c.contains("tie_word_embeddings"))
      require("tie_word_embeddings", c["tie_word_embeddings"] == true,
              "the head tied to the token embedding (tie_word_embeddings true)");
    file_ = std::make_unique<ModelFile>(
        gpt2_model_file(layers_, heads, width, context, vocab, vocab, 0, config_path));
  }
  // The weights: one file, or the shards of the index.
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    const nlohmann::json j = read_json(index.string());
    RT_REQUIRE(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "'",
               index.string(), "' lacks its weight_map object");
    std::map<std::string, size_t> file_index;
    for (const auto& [name, shard] : j["weight_map"].items()) {
      RT_REQUIRE(shard.is_string(), "'", index.string(), "': weight_map['", name,
                 "'] is not a file name");
      const std::string s = shard.get<std::string>();
      RT_REQUIRE(s.find('/') == std::string::npos && s != ".." && !s.empty(), "'", index.string(),
                 "': shard '", s, "' is not a file name in the directory");
      if (!file_index.count(s)) {
        const fs::path p = fs::path(dir) / s;
        RT_REQUIRE(fs::exists(p, ec), "'", index.string(), "' names shard '", s, "' (tensor '",
                   name, "'), which is missing from '", dir, "'");
        file_index[s] = files_.size();
        files_.push_back(std::make_unique<io::SafetensorsFile>(p.string()));
      }
      const io::SafetensorsFile& f = *files_[file_index[s]];
      const io::SafetensorsEntry* e = f.find(name);
      RT_REQUIRE(e, "'", index.string(), "' places tensor '", name, "' in shard '", s,
                 "', which does not hold it");
      tensors_[name] = e;
      shard_of_[name] = f.path();
    }
  } else {
    RT_REQUIRE(fs::exists(single, ec), "'", dir,
               "' has neither model.safetensors nor model.safetensors.index.json (PyTorch .bin "
               "weights are not read: save with safe_serialization=True)");
    files_.push_back(std::make_unique<io::SafetensorsFile>(single.string()));
    for (const auto& [name, e] : files_.back()->tensors()) {
      tensors_[name] = &e;
      shard_of_[name] = single.string();
    }
  }
  // GPT2LMHeadModel saves "transformer.*", LlamaForCausalLM "model.*"; GPT2Model (the hub's
  // gpt2) and LlamaModel the bare names.
  const std::string full_prefix = llama_ ? "model." : "transformer.";
  prefix_ = tensors_.count(full_prefix + (llama_ ? "embed_tokens.weight" : "wte.weight"))
                ? ""
                : full_prefix;
  std::set<std::string> expected;
  for (const auto& [name, shape] : model_param_shapes(*file_)) expected.insert(hf_name(name).name);
  for (const auto& [name, e] : tensors_) {
    const std::string full = prefix_ + name;
    if (expected.count(full) || expected.count(name)) continue;
    // A tied head; causal-mask and rotary buffers of older files.
    const bool ignored = name == "lm_head.weight" || full.ends_with(".attn.bias") ||
                         full.ends_with(".attn.masked_bias") ||
                         full.ends_with(".rotary_emb.inv_freq");
    RT_REQUIRE(ignored, "tensor '", name, "' of '", shard_of_.at(name), "' has no place in a ",
               arch_name_, " of ", layers_, " layers (config.json ",
               llama_ ? "num_hidden_layers" : "n_layer", ")");
  }
}

HfName HfModel::hf_name(const std::string& rt_name) const {
  return llama_ ? llama_hf_name(rt_name) : gpt2_hf_name(rt_name);
}

std::string HfModel::stored_name(const std::string& full) const {
  return !prefix_.empty() && full.starts_with(prefix_) ? full.substr(prefix_.size()) : full;
}

bool HfModel::padded_rows(const std::string& rt_name) const {
  return rt_name == (llama_ ? "embed_tokens.wte" : "embed.wte") ||
         (llama_ && rt_name == "lm_head.weight");
}

bool HfModel::has(const std::string& rt_name) const {
  const HfName h = hf_name(rt_name);
  return !h.name.empty() && tensors_.count(stored_name(h.name));
}

HfModel::Source HfModel::source_of(const std::string& rt_name) const {
  const HfName h = hf_name(rt_name);
  RT_REQUIRE(!h.name.empty(), "tensor '", rt_name, "' of the model has no ", arch_name_,
             " counterpart in '", dir_, "'");
  const std::string stored = stored_name(h.name);
  const auto it = tensors_.find(stored);
  RT_REQUIRE(it != tensors_.end(), "'", dir_, "' lacks tensor '", stored, "' (ringtrain's '",
             rt_name, "')");
  return {it->second, stored, h.transpose};
}

void HfModel::read(const std::vector<io::NamedTensor>& views) const {
  for (const auto& v : views) {
    const Source s = source_of(v.name);
    const Shape& want = v.logical_shape();
    const Shape& have = s.entry->shape;
    const std::string where = cat("'", shard_of_.at(s.hf_name), "'");
    RT_CHECK(v.tensor.dtype == DType::f32 && v.tensor.device.kind == Device::cpu,
             "HF weights are read into fp32 host tensors (", v.name, ")");
    float* out = static_cast<float*>(v.tensor.data);
    const int64_t first = v.part_offset, count = v.tensor.numel();
    if (s.transpose) {
      RT_REQUIRE(
          want.size() == 2 && have.size() == 2 && have[0] == want[1] && have[1] == want[0], where,
          ": tensor '", s.hf_name, "' has shape ", shape_str(have), "; ringtrain's '", v.name, "' ",
          shape_str(want), " needs ",
          want.size() == 2 ? shape_str(Shape{want[1], want[0]}) : std::string("2 dimensions"),
          " (Conv1D: [in, out])");
      // ringtrain [O, I] from HF [I, O]: element (o, i) is HF's (i, o); a row of HF at a time.
      const int64_t o_dim = want[0], i_dim = want[1];
      std::vector<float> row(static_cast<size_t>(o_dim));
      for (int64_t i = 0; i < i_dim; ++i) {
        io::safetensors_read_f32(*s.entry, i * o_dim, o_dim, row.data());
        // o such that first <= o * I + i < first + count
        const int64_t o_lo = std::max<int64_t>(0, (first - i + i_dim - 1) / i_dim);
        for (int64_t o = o_lo; o < o_dim; ++o) {
          const int64_t at = o * i_dim + i - first;
          if (at >= count) break;
          out[at] = row[size_t(o)];
        }
      }
      continue;
    }
    // Same layout; the embedding may have padded rows beyond the vocabulary (zeros).
    const bool padded = padded_rows(v.name);
    RT_REQUIRE(
        have.size() == want.size() &&
            (padded ? have.size() == 2 && have[1] == want[1] && have[0] <= want[0] : have == want),
        where, ": tensor '", s.hf_name, "' has shape ", shape_str(have), "; ringtrain's '", v.name,
        "' needs ", shape_str(want));
    const int64_t stored = s.entry->numel();
    const int64_t n = std::clamp<int64_t>(stored - first, 0, count);
    if (n > 0) io::safetensors_read_f32(*s.entry, first, n, out);
    std::fill(out + n, out + count, 0.f);
  }
}

}  // namespace ringtrain::launch
