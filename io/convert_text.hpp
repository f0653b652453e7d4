// `ringtrain convert text`: text files to a token dataset (format "ringtrain-tokens",
// docs/formats.md) with the byte-level tokenizer (vocabulary 256: a token is a byte, so any
// file, UTF-8 or not, converts losslessly), a held-out validation split and training
// shards. Each input file is one document.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ringtrain::io {

class SentencePieceTokenizer;

// The files --input values name, in order: a file as given, a directory's regular files
// (recursively, in name order), or a glob (matches in name order; `**` matches any number
// of directories). Input error naming the value when one names nothing.
std::vector<std::string> expand_text_inputs(const std::vector<std::string>& inputs);

// Which part of the stream goes to validation. With at least 1/F documents, document i
// (in input order) is held out when floor((i + 1) F) > floor(i F): every (1/F)-th
// document, spread over the corpus. With fewer documents, the last round(L F) tokens of
// the stream (L tokens in all). Returns the held-out token ranges [lo, hi) in order.
std::vector<std::pair<int64_t, int64_t>> validation_ranges(const std::vector<int64_t>& doc_offsets,
                                                           int64_t num_tokens, double fraction);

// The validation file's name for --out PATH: PATH without .h5, then "-val.h5".
std::string validation_name(const std::string& out);

// --max-input-mb's default: 1 GiB of text (about 9 GiB of memory while converting).
inline constexpr uint64_t kDefaultMaxTextInputBytes = 1ull << 30;

struct TextConvertResult {
  std::vector<std::string> train_files;
  std::string val_file;  // empty without a validation split
  int64_t files = 0, documents = 0, train_tokens = 0, val_tokens = 0, val_documents = 0;
  int64_t input_bytes = 0;    // of the non-empty documents
  double encode_seconds = 0;  // tokenising alone (no reading or writing)
  int64_t vocab_size = 0;
  std::string tokenizer;  // "bytes" or "sentencepiece"
};

// Tokenises the files `inputs` names and writes the training split as `shards` files (shard
// k holds tokens [k L / S, (k + 1) L / S) of the training stream; names as for image
// datasets) and, when val_fraction > 0, the validation split as one file. Files are written
// as NAME.tmp and renamed only when all are complete. An empty corpus, a split that leaves
// either side empty or more shards than tokens are input errors naming the input and the
// numbers; so are an input that is not a regular file (a FIFO, /dev/zero) and inputs of more
// than `max_input_bytes` in all, refused before any is read.
// With `tokenizer` (a SentencePiece model) each document is encoded by it, on `threads`
// threads (documents shared out), and followed by the model's end-of-text id (eos): the
// stream is doc0 EOT doc1 EOT ...; the files record the model (docs/formats.md). Without it,
// a token is a byte and no separator is added.
TextConvertResult convert_text(const std::vector<std::string>& inputs, const std::string& out,
                               int shards, double val_fraction,
                               uint64_t max_input_bytes = kDefaultMaxTextInputBytes,
                               const SentencePieceTokenizer* tokenizer = nullptr, int threads = 1);

}  // namespace ringtrain::io
