// `ringtrain sample` (see sample.hpp). The prompt is encoded with the tokenizer of the
// checkpoint's training data: bytes (a byte is a token, so any bytes are valid input) or the
// SentencePiece model the checkpoint records by checksum, and the samples are decoded with
// it. Each new token runs the model over the last T tokens, T being the window the model
// trained on (its input shape); there is no key/value cache, so a sample of N tokens costs N
// forward passes of at most T tokens -- milliseconds per token for the models a CPU trains.
// Sample i draws from the stream mix_seed(seed, i), so the text does not depend on the
// number of ranks; rank r computes the samples i with i mod W == r and rank 0 prints all of
// them.
#include "launch/sample.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "io/tokenizer.hpp"
#include "io/tokens.hpp"
#include "nn/sampling.hpp"
#include "train/device.hpp"
#include "train/job.hpp"
#include "train/model_source.hpp"

namespace ringtrain::launch {
namespace {

constexpr int64_t kByteVocab = 256;

// The prompt as token ids: bytes, or the SentencePiece model's encoding.
std::vector<int32_t> encode_prompt(const std::string& prompt,
                                   const io::SentencePieceTokenizer* tok) {
  std::vector<int32_t> ids;
  if (!tok) {
    for (char c : prompt) ids.push_back(int32_t(uint8_t(c)));
    return ids;
  }
  std::vector<uint32_t> v;
  tok->encode(prompt, v);
  ids.assign(v.begin(), v.end());
  return ids;
}

// `prompt` continued by `n` tokens (of the first `vocab` ids) drawn with `rng`, decoded.
std::string generate(Model& model, kernels::Backend& backend, const SampleConfig& cfg,
                     int64_t window, int64_t vocab, const io::SentencePieceTokenizer* tok,
                     Rng& rng) {
  std::vector<int32_t> ids = encode_prompt(cfg.prompt, tok);
  Context ctx{backend, model.compute_dtype(), /*training=*/false};
  const Device dev = backend.device();
  DeviceScope on_device(dev);
  OwnedTensor x;
  std::vector<float> last;
  for (int64_t k = 0; k < cfg.tokens; ++k) {
    const int64_t t = std::min<int64_t>(window, int64_t(ids.size()));
    Tensor& xt = x.ensure({1, t}, DType::i32, dev);
    copy_bytes(xt.data, dev, ids.data() + (ids.size() - size_t(t)), Device{},
               size_t(t) * sizeof(int32_t));
    const Tensor& logits = model.forward(ctx, xt);
    RT_CHECK(logits.dtype == DType::f32 && logits.shape.size() == 3 && logits.dim(1) == t &&
                 logits.dim(2) >= vocab,
             "logits of shape ", shape_str(logits.shape), " for ", t, " tokens");
    const int64_t row = logits.dim(2);
    last.resize(size_t(row));
    copy_bytes(last.data(), Device{}, logits.as<float>() + (t - 1) * row, logits.device,
               size_t(row) * sizeof(float));
    ids.push_back(sample_token(last.data(), vocab, cfg.temperature, cfg.top_k, rng));
  }
  if (tok) return tok->decode(ids);
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) text[i] = char(uint8_t(ids[i]));
  return text;
}

// The tokenizer `sample` encodes and decodes with: none (bytes) or the SentencePiece model of
// the checkpoint's training data, from --tokenizer or from the training shard it names, whose
// SHA-256 must be the one the checkpoint records.
std::optional<io::SentencePieceTokenizer> sample_tokenizer(const SampleConfig& cfg,
                                                           const io::CheckpointMeta& meta) {
  const std::string ckpt = cat("checkpoint '", cfg.checkpoint, "'");
  if (meta.tokenizer.empty() || meta.tokenizer == "bytes") {
    RT_REQUIRE(cfg.tokenizer.empty() || meta.tokenizer.empty(), "--tokenizer '", cfg.tokenizer,
               "' given, but ", ckpt,
               " was trained on byte tokens (tokenizer 'bytes'); leave --tokenizer out");
    if (cfg.tokenizer.empty()) return std::nullopt;
    return io::SentencePieceTokenizer::from_file(cfg.tokenizer, "--tokenizer");
  }
  RT_REQUIRE(meta.tokenizer == io::kSentencePieceKind, ckpt, " records tokenizer '", meta.tokenizer,
             "', which this ringtrain cannot decode (it knows bytes and ", io::kSentencePieceKind,
             ")");
  if (!cfg.tokenizer.empty()) {
    auto tok = io::SentencePieceTokenizer::from_file(cfg.tokenizer, "--tokenizer");
    RT_REQUIRE(tok.sha256() == meta.tokenizer_sha256, "--tokenizer '", cfg.tokenizer,
               "' has SHA-256 ", tok.sha256(), ", but ", ckpt,
               " was trained on data encoded with the SentencePiece model of SHA-256 ",
               meta.tokenizer_sha256, "; pass that model file");
    return tok;
  }
  RT_REQUIRE(!meta.tokenizer_data.empty(), ckpt,
             " records no training shard holding its tokenizer; pass --tokenizer MODEL");
  std::error_code ec;
  RT_REQUIRE(std::filesystem::is_regular_file(meta.tokenizer_data, ec), ckpt,
             " reads its SentencePiece model from training shard '", meta.tokenizer_data,
             "', which does not exist; pass --tokenizer MODEL (the file given to convert text)");
  io::TokenShard shard(meta.tokenizer_data);
  RT_REQUIRE(shard.info().tokenizer_sha256 == meta.tokenizer_sha256, "training shard '",
             meta.tokenizer_data, "' now holds the tokenizer of SHA-256 ",
             shard.info().tokenizer_sha256, ", but ", ckpt, " records ", meta.tokenizer_sha256,
             "; pass --tokenizer MODEL (the file given to convert text)");
  return io::SentencePieceTokenizer::from_bytes(
      shard.tokenizer_model(), cat("/tokenizer_model of '", meta.tokenizer_data, "'"));
}

}  // namespace

int run_sample(const SampleConfig& cfg, comm::Communicator& comm) {
  std::unique_ptr<kernels::Backend> backend;
  LoadedModel loaded;
  int64_t window = 0, vocab = 0;
  std::optional<io::SentencePieceTokenizer> tok;
  run_and_agree(comm, [&] {
    const Device device = choose_device(cfg.device, comm);
    backend = make_backend(device, threads_for_rank(cfg.threads, comm), cfg.gpu_memory);
    load_plugins(cfg.plugins);
    loaded = load_model_from_checkpoint(cfg.checkpoint, cfg.precision, device, *backend);
    const Model& m = *loaded.model;
    const TokenInput lm =
        token_input_of(plan_model(model_from_checkpoint(loaded.meta, cfg.checkpoint)));
    RT_REQUIRE(lm.takes_tokens, "checkpoint '", cfg.checkpoint, "' holds a model of ",
               shape_str(m.input_shape()),
               " inputs, not a language model; `sample` needs a model whose input is token ids "
               "(e.g. models/gpt-tiny.pbtxt trained on a token dataset)");
    tok = sample_tokenizer(cfg, loaded.meta);
    if (tok) {
      vocab = tok->vocab_size();
      RT_REQUIRE(
          vocab <= m.classes(), "checkpoint '", cfg.checkpoint,
          "' holds a model of a vocabulary of ", m.classes(),
          " tokens, smaller than the tokenizer's ", vocab,
          (cfg.tokenizer.empty() ? std::string() : cat(" (--tokenizer '", cfg.tokenizer, "')")),
          "; use the model trained with that tokenizer");
    } else {
      vocab = kByteVocab;
      RT_REQUIRE(m.classes() == kByteVocab, "checkpoint '", cfg.checkpoint,
                 "' holds a model of a vocabulary of ", m.classes(),
                 " tokens; `sample` encodes text with the byte tokenizer (vocabulary ", kByteVocab,
                 ", what `ringtrain convert text` writes) unless the checkpoint records a "
                 "tokenizer or --tokenizer gives one");
    }
    check_sampling_options(cfg.temperature, cfg.top_k, vocab);
    RT_REQUIRE(m.input_shape().size() == 1 && m.input_shape()[0] >= 1, "checkpoint '",
               cfg.checkpoint, "': the model's input shape ", shape_str(m.input_shape()),
               " is not a window of tokens [T]");
    window = m.input_shape()[0];
    RT_REQUIRE(!encode_prompt(cfg.prompt, tok ? &*tok : nullptr).empty(), "--prompt '", cfg.prompt,
               "' encodes to no tokens; give text to continue");
    RT_REQUIRE(double(cfg.num_samples) * double(cfg.prompt.size() + size_t(cfg.tokens)) < 1e9,
               "--num-samples ", cfg.num_samples, " x (prompt + --tokens ", cfg.tokens,
               ") bytes is more text than `sample` gathers (1e9 bytes); draw fewer");
  });
  const int w = comm.size(), r = comm.rank();
  // Rank r's texts, then every text on rank 0 in sample order (collective).
  std::vector<std::string> texts;
  run_or_fail([&] {
    std::vector<std::string> mine;
    for (int64_t i = r; i < cfg.num_samples; i += w) {
      Rng rng(mix_seed(uint64_t(cfg.seed), uint64_t(i)));
      mine.push_back(
          generate(*loaded.model, *backend, cfg, window, vocab, tok ? &*tok : nullptr, rng));
    }
    // Each text as its length (8 bytes) and its bytes: decoded texts differ in length.
    std::string packed;
    for (const std::string& t : mine) {
      const uint64_t n = t.size();
      packed.append(reinterpret_cast<const char*>(&n), sizeof n);
      packed += t;
    }
    const int64_t mine_bytes = int64_t(packed.size());
    std::vector<int64_t> sizes(static_cast<size_t>(w)), displs(static_cast<size_t>(w));
    comm.allgather(&mine_bytes, sizes.data(), 1, DType::i64);
    int64_t total = 0;
    for (int q = 0; q < w; ++q) displs[size_t(q)] = total, total += sizes[size_t(q)];
    std::string all(r == 0 ? size_t(total) : 0, '\0');
    comm.gatherv(packed.data(), all.data(), sizes, DType::u8, 0);
    if (r != 0) return;
    texts.resize(size_t(cfg.num_samples));
    for (int q = 0; q < w; ++q) {
      size_t at = size_t(displs[size_t(q)]);
      for (int64_t i = q; i < cfg.num_samples; i += w) {
        uint64_t n = 0;
        std::memcpy(&n, all.data() + at, sizeof n);
        texts[size_t(i)] = all.substr(at + sizeof n, size_t(n));
        at += sizeof n + size_t(n);
      }
    }
  });
  if (r == 0) {
    for (int64_t i = 0; i < cfg.num_samples; ++i) {
      if (cfg.num_samples > 1)
        std::printf("%s--- sample %lld of %lld (seed %lld) ---\n", i ? "\n" : "",
                    static_cast<long long>(i + 1), static_cast<long long>(cfg.num_samples),
                    static_cast<long long>(cfg.seed));
      std::fwrite(texts[size_t(i)].data(), 1, texts[size_t(i)].size(), stdout);
      std::fputc('\n', stdout);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace ringtrain::launch
