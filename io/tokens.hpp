// Token datasets (format "ringtrain-tokens" v1, docs/formats.md): one or more shard files
// each holding a 1-D token stream /tokens, and the windows a language model trains on.
// A window of length T is T + 1 consecutive tokens of one shard (inputs and next-token
// targets); window w of a shard starts at token w * T, so the windows tile the stream and
// each token is a target once. The global window index runs through the shards in name
// order, like the sample index of image datasets, so the loader's permutation rule applies
// unchanged. Reads are one hyperslab per window: a rank reads only its own windows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "io/hdf5.hpp"

namespace ringtrain::io {

inline constexpr const char* kTokensFormat = "ringtrain-tokens";
inline constexpr int64_t kTokensVersion = 1;

// What a --data file holds, from its root attribute `format`: image samples with labels
// ("ringtrain-dataset"), a token stream ("ringtrain-tokens"), or neither (unknown).
enum class DataKind { images, tokens, unknown };
const char* data_kind_name(DataKind k);  // "images", "tokens", "unknown"
// The kind of the first file a --data value names (input error when there is none).
DataKind data_kind_of(const std::string& spec);

struct TokenShardInfo {
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  std::string tokenizer;         // "bytes" or "sentencepiece"
  std::string tokenizer_sha256;  // sentencepiece: of the model file's bytes (/tokenizer_model)
  int64_t eot_id = -1;           // sentencepiece: the id that ends each document
  std::string split;             // "train" or "val" (informational)
  int64_t num_docs = 0;          // documents (or pieces of documents) in this shard
  int token_bytes = 1;           // stored width of /tokens: 1, 2 or 4
};

// One validated token file.
class TokenShard {
 public:
  // Opens and validates; a problem is an input error naming the file and what was expected.
  explicit TokenShard(std::string path);
  const std::string& path() const { return path_; }
  const TokenShardInfo& info() const { return info_; }
  // Tokens [lo, lo + n) into dst as uint32 (any stored width).
  void read(int64_t lo, int64_t n, uint32_t* dst);
  // The document start offsets (/doc_offsets: num_docs + 1 values, the last = num_tokens).
  std::vector<int64_t> doc_offsets();
  // The tokenizer model's bytes (/tokenizer_model), checked against tokenizer_sha256; empty
  // for the byte tokenizer.
  std::string tokenizer_model();

 private:
  std::string path_;
  TokenShardInfo info_;
  H5Id file_, tokens_;
};

struct TokenDatasetInfo {
  std::string path;  // as given: file, directory or glob
  int64_t num_shards = 0;
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  std::string tokenizer;
  std::string tokenizer_sha256;  // empty for bytes
  int64_t shortest_shard = 0;    // tokens in the shortest shard
  std::string shortest_file;
};

class TokenDataset {
 public:
  // Opens every shard of `spec` (a file, directory or glob, as for images); they must agree
  // on vocab_size and tokenizer.
  explicit TokenDataset(const std::string& spec);
  const TokenDatasetInfo& info() const { return info_; }
  TokenShard& shard(size_t i) { return *shards_[i]; }

  // Fixes the window length T; input error (naming the shortest shard and its length) when
  // a shard holds fewer than T + 1 tokens, or T < 1.
  void set_seq_len(int64_t seq_len);
  int64_t seq_len() const { return seq_len_; }
  int64_t num_windows() const { return offsets_.empty() ? 0 : offsets_.back(); }

  // Windows idx[0..n) (global window indices, any order) into x [n, T] (inputs) and
  // y [n, T] (targets: the inputs shifted by one token), as int32. A token >= vocab_size
  // is an input error naming the file and the token's position. Safe to call from several
  // threads (each read holds the HDF5 lock).
  void read_windows(const int64_t* idx, int64_t n, int32_t* x, int32_t* y);

 private:
  TokenDatasetInfo info_;
  std::vector<std::unique_ptr<TokenShard>> shards_;
  int64_t seq_len_ = 0;
  std::vector<int64_t> offsets_;  // first global window of each shard, plus the total
};

// The data side of the checks between a dataset and the model given it (input errors naming
// the file, the model and the numbers): the data's kind must be the one the model takes;
// for tokens, the vocabulary must fit the model's embedding (vocab_size <= model_vocab) and
// the windows its context (seq_len <= model_context). Data of an unknown kind passes
// require_data_kind: the reader of the wanted kind then names what is wrong with it.
// `who` names the model: "model 'mlp'", "the model of checkpoint 'C'".
void require_data_kind(const std::string& path, DataKind have, DataKind want,
                       const std::string& who);
void require_tokens_fit_model(const TokenDatasetInfo& info, int64_t seq_len, int64_t model_vocab,
                              int64_t model_context, const std::string& model);

// A tokenizer's identity as datasets and checkpoints record it: the kind ("bytes",
// "sentencepiece"), the SHA-256 of the model file (empty for bytes) and the vocabulary.
struct TokenizerId {
  std::string kind, sha256;
  int64_t vocab_size = 0;
  bool operator==(const TokenizerId& o) const { return kind == o.kind && sha256 == o.sha256; }
  std::string describe() const;  // "sentencepiece (sha256 0123abcd..., vocabulary 512)"
};
TokenizerId tokenizer_id_of(const TokenDatasetInfo& info);
// Input error unless `b` (described as `b_what`) was encoded with the tokenizer `a` of
// `a_what`, naming both and the two tokenizers.
void require_same_tokenizer(const TokenizerId& a, const std::string& a_what, const TokenizerId& b,
                            const std::string& b_what);

// The tokenizer a token file records beyond its kind: the model bytes (stored as
// /tokenizer_model, uint8), their SHA-256 and the end-of-text id.
struct TokenizerRecord {
  std::string model_bytes, sha256;
  int64_t eot_id = -1;
};

// Writes one token file (format v1) at `path` from the stream tokens[0..n) (n >= 1) with the
// given document start offsets (docs.front() == 0, increasing, each < n). /tokens is stored
// as the narrowest of uint8/uint16/uint32 that holds vocab_size, chunked (about 1 MiB),
// without filters, so that a window is read straight from the file.
void write_token_file(const std::string& path, const uint32_t* tokens, int64_t n,
                      const std::vector<int64_t>& docs, int64_t vocab_size,
                      const std::string& tokenizer, const std::string& split,
                      const TokenizerRecord* record = nullptr);

}  // namespace ringtrain::io
