// Tokenizers of token datasets beyond bytes: SentencePiece models (BPE or unigram) loaded,
// trained, used to encode documents and decode samples, identified by the SHA-256 of the
// model file's bytes. Used by `ringtrain tokenizer train`, `convert text --tokenizer`, the
// checks between datasets and checkpoints, and `sample`. The library (Debian
// libsentencepiece-dev) stays behind this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ringtrain::io {

// The `tokenizer` attribute of token datasets written with a SentencePiece model.
inline constexpr const char* kSentencePieceKind = "sentencepiece";

// The SHA-256 of `bytes` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view bytes);

class SentencePieceTokenizer {
 public:
  // The model file at `path` (input error naming `option` and the file when it cannot be
  // read or is not a SentencePiece model).
  static SentencePieceTokenizer from_file(const std::string& path, const std::string& option);
  // A model from its serialized bytes (e.g. as stored in a token dataset); `what` names their
  // source in messages.
  static SentencePieceTokenizer from_bytes(std::string bytes, const std::string& what);
  ~SentencePieceTokenizer();
  SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept;
  SentencePieceTokenizer& operator=(SentencePieceTokenizer&&) noexcept;

  const std::string& model_bytes() const { return bytes_; }
  const std::string& sha256() const { return sha256_; }
  int64_t vocab_size() const;
  // The end-of-text id (the model's eos piece, `</s>`); -1 when the model defines none.
  int64_t eos_id() const;
  // Appends the ids of `text` to `out` (thread-safe: encoding does not change the model).
  void encode(std::string_view text, std::vector<uint32_t>& out) const;
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  struct Impl;
  SentencePieceTokenizer(std::unique_ptr<Impl> impl, std::string bytes);
  std::unique_ptr<Impl> impl_;
  std::string bytes_, sha256_;
};

struct TokenizerTrainSpec {
  std::vector<std::string> files;  // the corpus, one document per file
  int64_t vocab_size = 0;
  std::string model_type = "bpe";  // bpe | unigram
  int threads = 1;
};

// Trains a SentencePiece model on the lines of `spec.files` and returns its serialized bytes.
// The model keeps every input byte: no normalisation (identity), whitespace kept as is, a
// newline piece, and bytes outside the vocabulary encoded as <0xNN> pieces (byte fallback),
// so decode(encode(x)) == x for any UTF-8 text. Ids 0..2 are <unk>, <s>, </s>. Library
// refusals (a vocabulary too small or too large for the corpus) are input errors naming
// --vocab-size and the library's reason.
std::string train_sentencepiece(const TokenizerTrainSpec& spec);

}  // namespace ringtrain::io
