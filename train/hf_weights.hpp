// Hugging Face model directories (config.json + model.safetensors, or the shards a
// model.safetensors.index.json names) as ringtrain models and weights, and back: GPT-2
// (`model_type` "gpt2", GPT2LMHeadModel) maps onto the shipped gpt2-124m model file with the
// config's sizes, Llama (`model_type` "llama", LlamaForCausalLM) onto llama-tiny's. The GPT-2
// name mapping (docs/formats.md, "Hugging Face weights"):
//   transformer.wte.weight [V, C]            embed.wte [padded_vocab, C] (rows >= V zero)
//   transformer.wpe.weight [P, C]            embed.wpe [context, C]
//   transformer.h.I.ln_1.{weight,bias}       blockI.ln1.{weight,bias}
//   transformer.h.I.attn.c_attn.weight [C,3C]   blockI.qkv.weight [3C, C] (transposed: Conv1D)
//   transformer.h.I.attn.c_proj.weight [C,C]    blockI.attn_proj.weight (transposed)
//   transformer.h.I.ln_2.{weight,bias}       blockI.ln2.{weight,bias}
//   transformer.h.I.mlp.c_fc.weight [C,4C]   blockI.fc.weight [4C, C] (transposed)
//   transformer.h.I.mlp.c_proj.weight [4C,C] blockI.fc_proj.weight [C, 4C] (transposed)
//   transformer.ln_f.{weight,bias}           ln_f.{weight,bias}
//   lm_head.weight                           tied to embed.wte (not stored)
// with each Conv1D bias as it is. Llama: ringtrain's names are HF's without "model."
// (embed_tokens.wte is model.embed_tokens.weight, lm_head.weight is lm_head.weight), every
// tensor in HF's layout (nn.Linear [out, in]), the head shared with embed_tokens.wte when
// tie_word_embeddings. Used by `convert hf`, `train --init-from HF_DIR` and
// `export --format hf`.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "nn/model_file.hpp"

namespace ringtrain::launch {

// A Hugging Face tensor name, and whether it is stored transposed (Conv1D); name "" for none.
struct HfName {
  std::string name;
  bool transpose = false;
};

class HfModel {
 public:
  // Reads DIR/config.json and maps DIR's safetensors files. Input errors name the file and
  // the key or tensor: no config.json, an unknown model_type (architecture), a config value
  // the model file cannot express (each named), a shard the index names that is missing, a
  // safetensors file that is damaged, a tensor of the wrong shape or one missing.
  explicit HfModel(const std::string& dir);
  const std::string& dir() const { return dir_; }
  // The ringtrain model of this directory: gpt2-124m's or llama-tiny's file with the config's
  // sizes, for windows of `context` tokens over `vocab_size` classes.
  const ModelFile& model_file() const { return *file_; }
  // "GPT-2" or "Llama", and the shipped model file the model is built from.
  const std::string& arch_name() const { return arch_name_; }
  const std::string& base_model() const { return base_model_; }
  // Whether a ringtrain tensor may have more rows than HF's (the vocabulary padded): the
  // embedding, and Llama's untied head; the rows beyond HF's are zero.
  bool padded_rows(const std::string& rt_name) const;
  // Fills each view (a whole tensor, or a part with full_shape) from the mapped files,
  // converting to fp32 and transposing Conv1D weights element by element (no tensor is
  // copied whole). Input error naming both tensors when a shape does not match.
  void read(const std::vector<io::NamedTensor>& views) const;
  // Whether a ringtrain tensor name has a source here.
  bool has(const std::string& rt_name) const;

 private:
  struct Source {
    const io::SafetensorsEntry* entry;
    std::string hf_name;
    bool transpose;
  };
  Source source_of(const std::string& rt_name) const;
  // HF's full name of a ringtrain tensor, and the name as this directory stores it.
  HfName hf_name(const std::string& rt_name) const;
  std::string stored_name(const std::string& full) const;
  void read_llama_config(const nlohmann::json& c, const std::string& path);
  bool llama_ = false;
  std::string dir_, prefix_, arch_name_, base_model_;
  int64_t layers_ = 0;
  std::unique_ptr<ModelFile> file_;
  std::vector<std::unique_ptr<io::SafetensorsFile>> files_;
  std::map<std::string, const io::SafetensorsEntry*> tensors_;  // HF name -> entry
  std::map<std::string, std::string> shard_of_;                 // HF name -> file, for messages
};

// Whether `path` is a Hugging Face model directory (a directory with config.json).
bool is_hf_dir(const std::string& path);

// The GPT-2 model file (gpt2-124m's) at these sizes, for windows of `context` tokens over
// `classes` classes, named "gpt2"; `origin` names it in messages.
ModelFile gpt2_model_file(int64_t layers, int64_t heads, int64_t width, int64_t context,
                          int64_t padded_vocab, int64_t classes, double dropout,
                          const std::string& origin);

// The parameters a model file builds, as (name, shape) in build order, a shared one once
// (under its owner's name), without allocating them.
std::vector<std::pair<std::string, Shape>> model_param_shapes(const ModelFile& file);

// The Hugging Face name (GPT2LMHeadModel's, "transformer.h.0.attn.c_attn.weight") of a
// ringtrain GPT-2 tensor, and whether it is stored transposed (Conv1D); name "" for none.
HfName gpt2_hf_name(const std::string& rt_name);
// The same for Llama (LlamaForCausalLM's "model.layers.0.self_attn.q_proj.weight"; never
// transposed).
HfName llama_hf_name(const std::string& rt_name);

// The Llama model file (llama-tiny's) at these sizes, named "llama", the head shared with
// embed_tokens.wte when `tied`.
struct LlamaSizes {
  int64_t layers, heads, kv_heads, width, ffn, context, padded_vocab, classes;
  double rope_theta, norm_eps;
  bool tied;
};
ModelFile llama_model_file(const LlamaSizes& s, const std::string& origin);

}  // namespace ringtrain::launch
