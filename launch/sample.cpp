// `ringtrain sample` (see sample.hpp). The prompt is encoded with the byte tokenizer (the
// only one token datasets have: a byte is a token), so any bytes are valid input. Each new
// token runs the model over the last T tokens, T being the window the model trained on
// (its input shape); there is no key/value cache, so a sample of N tokens costs N forward
// passes of at most T tokens -- milliseconds per token for the models a CPU trains. Sample
// i draws from the stream mix_seed(seed, i), so the text does not depend on the number of
// ranks; rank r computes the samples i with i mod W == r and rank 0 prints all of them.
#include "launch/sample.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "nn/sampling.hpp"
#include "train/device.hpp"
#include "train/job.hpp"
#include "train/model_source.hpp"

namespace ringtrain::launch {
namespace {

constexpr int64_t kByteVocab = 256;

// `prompt` continued by `n` tokens drawn with `rng`.
std::string generate(Model& model, kernels::Backend& backend, const SampleConfig& cfg,
                     int64_t window, Rng& rng) {
  const int64_t vocab = model.classes();
  std::vector<int32_t> ids(cfg.prompt.begin(), cfg.prompt.end());
  for (int32_t& id : ids) id = int32_t(uint8_t(id));
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
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) text[i] = char(uint8_t(ids[i]));
  return text;
}

}  // namespace

int run_sample(const SampleConfig& cfg, comm::Communicator& comm) {
  std::unique_ptr<kernels::Backend> backend;
  LoadedModel loaded;
  int64_t window = 0;
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
    RT_REQUIRE(m.classes() == kByteVocab, "checkpoint '", cfg.checkpoint,
               "' holds a model of a vocabulary of ", m.classes(),
               " tokens; `sample` encodes text with the byte tokenizer (vocabulary ", kByteVocab,
               ", what `ringtrain convert text` writes)");
    check_sampling_options(cfg.temperature, cfg.top_k, m.classes());
    RT_REQUIRE(m.input_shape().size() == 1 && m.input_shape()[0] >= 1, "checkpoint '",
               cfg.checkpoint, "': the model's input shape ", shape_str(m.input_shape()),
               " is not a window of tokens [T]");
    window = m.input_shape()[0];
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
      mine.push_back(generate(*loaded.model, *backend, cfg, window, rng));
    }
    std::string packed;
    for (const std::string& t : mine) packed += t;
    const int64_t mine_bytes = int64_t(packed.size());
    std::vector<int64_t> sizes(static_cast<size_t>(w)), displs(static_cast<size_t>(w));
    comm.allgather(&mine_bytes, sizes.data(), 1, DType::i64);
    int64_t total = 0;
    for (int q = 0; q < w; ++q) displs[size_t(q)] = total, total += sizes[size_t(q)];
    std::string all(r == 0 ? size_t(total) : 0, '\0');
    comm.gatherv(packed.data(), all.data(), sizes, DType::u8, 0);
    if (r != 0) return;
    // Every sample is prompt + tokens bytes long: cut rank q's block into its samples.
    const size_t len = cfg.prompt.size() + size_t(cfg.tokens);
    texts.resize(size_t(cfg.num_samples));
    for (int q = 0; q < w; ++q)
      for (int64_t i = q, j = 0; i < cfg.num_samples; i += w, ++j)
        texts[size_t(i)] = all.substr(size_t(displs[size_t(q)]) + size_t(j) * len, len);
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
