// Token files: validation, window reads and the writer (see tokens.hpp).
#include "io/tokens.hpp"

#include <algorithm>
#include <limits>

#include "io/dataset.hpp"
#include "io/shard.hpp"
#include "io/tokenizer.hpp"

namespace ringtrain::io {

const char* data_kind_name(DataKind k) {
  switch (k) {
    case DataKind::images:
      return "images";
    case DataKind::tokens:
      return "tokens";
    default:
      return "unknown";
  }
}

DataKind data_kind_of(const std::string& spec) {
  const std::string file = resolve_dataset_files(spec).front();
  H5Lock lock;
  H5Id f = open_file_readonly(file, "dataset");
  const auto format = read_attr_string(f, "format");
  if (format && *format == kDatasetFormat) return DataKind::images;
  if (format && *format == kTokensFormat) return DataKind::tokens;
  return DataKind::unknown;
}

TokenShard::TokenShard(std::string path) : path_(std::move(path)) {
  H5Lock lock;
  file_ = open_file_readonly(path_, "dataset");
  const std::string what = cat("token dataset '", path_, "'");
  const auto format = read_attr_string(file_, "format");
  RT_REQUIRE(!(format && *format == kDatasetFormat), what,
             " holds images and labels (format 'ringtrain-dataset'), not a token stream; a "
             "language model trains on text converted with `ringtrain convert text`");
  RT_REQUIRE(format && *format == kTokensFormat, what,
             " is not a ringtrain token dataset: root attribute 'format' is ",
             format ? "'" + *format + "'" : std::string("missing"), "; expected '", kTokensFormat,
             "' (create one with `ringtrain convert text`)");
  const auto version = read_attr_int(file_, "format_version");
  RT_REQUIRE(version && *version == kTokensVersion, what, " has format_version ",
             version ? std::to_string(*version) : "missing", "; this ringtrain reads version ",
             kTokensVersion);
  const auto vocab = read_attr_int(file_, "vocab_size");
  RT_REQUIRE(vocab && *vocab >= 2 && *vocab <= std::numeric_limits<int32_t>::max(), what,
             " needs an integer attribute vocab_size from 2 to 2^31-1, got ",
             vocab ? std::to_string(*vocab) : "none");
  info_.vocab_size = *vocab;
  info_.tokenizer = read_attr_string(file_, "tokenizer").value_or("");
  RT_REQUIRE(!info_.tokenizer.empty(), what, " needs a string attribute tokenizer (e.g. 'bytes')");
  if (info_.tokenizer == kSentencePieceKind) {
    info_.tokenizer_sha256 = read_attr_string(file_, "tokenizer_sha256").value_or("");
    RT_REQUIRE(info_.tokenizer_sha256.size() == 64, what, " records tokenizer '", info_.tokenizer,
               "' without a string attribute tokenizer_sha256 of 64 hex digits");
    info_.eot_id = read_attr_int(file_, "eot_id").value_or(-1);
  }
  info_.split = read_attr_string(file_, "split").value_or("");
  RT_REQUIRE(has_link(file_, "tokens"), what, " must hold a dataset /tokens");
  // No chunk cache: with uncompressed chunks HDF5 then reads just a window's bytes instead
  // of staging a whole chunk for each window.
  H5Id dapl(H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS)));
  H5_CHECK(H5Pset_chunk_cache(dapl, 0, 0, 1.0));
  tokens_ = open_dataset(file_, "tokens", dapl);
  const Shape shape = dataset_shape(tokens_);
  RT_REQUIRE(shape.size() == 1, what, ": /tokens has shape ", shape_str(shape),
             "; expected a 1-d stream [N]");
  H5Id type(H5_CHECK(H5Dget_type(tokens_)));
  const size_t width = H5Tget_size(type);
  RT_REQUIRE(H5Tget_class(type) == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_NONE &&
                 (width == 1 || width == 2 || width == 4),
             what, ": /tokens must be uint8, uint16 or uint32");
  RT_REQUIRE(width == 4 || info_.vocab_size <= (int64_t(1) << (8 * width)), what, ": vocab_size ",
             info_.vocab_size, " does not fit /tokens of ", 8 * width, "-bit integers");
  info_.token_bytes = int(width);
  info_.num_tokens = shape[0];
  RT_REQUIRE(info_.num_tokens >= 1, what, " holds no tokens");
  H5Id dcpl(H5_CHECK(H5Dget_create_plist(tokens_)));
  if (H5Pget_nfilters(dcpl) == 0) {
    const uint64_t stored = H5Dget_storage_size(tokens_);
    RT_REQUIRE(stored >= uint64_t(info_.num_tokens) * width, what, " declares ", info_.num_tokens,
               " tokens (", uint64_t(info_.num_tokens) * width, " bytes) but the file stores ",
               stored, " bytes of them; the file is truncated or was never fully written");
  }
  if (has_link(file_, "doc_offsets")) {
    H5Id docs = open_dataset(file_, "doc_offsets");
    const Shape ds = dataset_shape(docs);
    RT_REQUIRE(ds.size() == 1 && ds[0] >= 2, what, ": /doc_offsets has shape ", shape_str(ds),
               "; expected [documents + 1] with at least one document");
    info_.num_docs = ds[0] - 1;
    doc_offsets();  // validated now: offsets that go backwards are a damaged file
  } else {
    info_.num_docs = 1;
  }
}

void TokenShard::read(int64_t lo, int64_t n, uint32_t* dst) {
  RT_CHECK(lo >= 0 && n >= 0 && lo + n <= info_.num_tokens, "tokens [", lo, ", ", lo + n,
           ") outside [0, ", info_.num_tokens, ") of ", path_);
  if (n == 0) return;
  H5Lock lock;
  H5Id fspace(H5_CHECK(H5Dget_space(tokens_)));
  const hsize_t start = hsize_t(lo), count = hsize_t(n);
  H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &count, nullptr));
  H5Id mspace(H5_CHECK(H5Screate_simple(1, &count, nullptr)));
  RT_REQUIRE(H5Dread(tokens_, H5T_NATIVE_UINT32, mspace, fspace, H5P_DEFAULT, dst) >= 0,
             "token dataset '", path_, "': tokens [", lo, ", ", lo + n, ") cannot be read (",
             h5_error_stack(), ")");
}

std::vector<int64_t> TokenShard::doc_offsets() {
  H5Lock lock;
  if (!has_link(file_, "doc_offsets")) return {0, info_.num_tokens};
  H5Id ds = open_dataset(file_, "doc_offsets");
  std::vector<int64_t> v(size_t(info_.num_docs + 1));
  RT_REQUIRE(H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0,
             "token dataset '", path_, "': /doc_offsets cannot be read (", h5_error_stack(), ")");
  const auto back = std::is_sorted_until(v.begin(), v.end());
  RT_REQUIRE(
      v.front() == 0 && v.back() == info_.num_tokens && back == v.end(), "token dataset '", path_,
      "': /doc_offsets must rise from 0 to ", info_.num_tokens, " (the number of tokens)",
      back != v.end()
          ? cat("; it goes back from ", back[-1], " to ", *back, " at index ", back - v.begin())
          : cat("; it runs from ", v.front(), " to ", v.back()));
  return v;
}

std::string TokenShard::tokenizer_model() {
  if (info_.tokenizer_sha256.empty()) return {};
  H5Lock lock;
  const std::string what = cat("token dataset '", path_, "'");
  RT_REQUIRE(has_link(file_, "tokenizer_model"), what, " records tokenizer '", info_.tokenizer,
             "' but holds no /tokenizer_model (the model file's bytes)");
  H5Id ds = open_dataset(file_, "tokenizer_model");
  const Shape shape = dataset_shape(ds);
  RT_REQUIRE(shape.size() == 1 && shape[0] >= 1 && shape[0] <= (int64_t(1) << 30), what,
             ": /tokenizer_model has shape ", shape_str(shape), "; expected [bytes]");
  std::string bytes(size_t(shape[0]), '\0');
  RT_REQUIRE(H5Dread(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()) >= 0, what,
             ": /tokenizer_model cannot be read (", h5_error_stack(), ")");
  const std::string sum = sha256_hex(bytes);
  RT_REQUIRE(sum == info_.tokenizer_sha256, what, ": /tokenizer_model has SHA-256 ", sum,
             " but the attribute tokenizer_sha256 says ", info_.tokenizer_sha256,
             "; the file is damaged");
  return bytes;
}

TokenDataset::TokenDataset(const std::string& spec) {
  info_.path = spec;
  for (const auto& f : resolve_dataset_files(spec)) {
    shards_.push_back(std::make_unique<TokenShard>(f));
    const TokenShardInfo& s = shards_.back()->info();
    const TokenShardInfo& first = shards_.front()->info();
    RT_REQUIRE(s.vocab_size == first.vocab_size && s.tokenizer == first.tokenizer &&
                   s.tokenizer_sha256 == first.tokenizer_sha256,
               "token dataset shard '", f, "' has vocab_size ", s.vocab_size, " (tokenizer '",
               s.tokenizer, "'), but '", shards_.front()->path(), "' has ", first.vocab_size, " ('",
               first.tokenizer, "'); all shards of a dataset must share one vocabulary");
    info_.num_tokens += s.num_tokens;
    if (info_.shortest_file.empty() || s.num_tokens < info_.shortest_shard) {
      info_.shortest_shard = s.num_tokens;
      info_.shortest_file = f;
    }
  }
  info_.num_shards = int64_t(shards_.size());
  info_.vocab_size = shards_.front()->info().vocab_size;
  info_.tokenizer = shards_.front()->info().tokenizer;
  info_.tokenizer_sha256 = shards_.front()->info().tokenizer_sha256;
}

void TokenDataset::set_seq_len(int64_t seq_len) {
  RT_REQUIRE(seq_len >= 1, "--seq-len ", seq_len, " is not valid; expected a positive length");
  RT_REQUIRE(info_.shortest_shard >= seq_len + 1, "--seq-len ", seq_len,
             " is longer than token dataset '", info_.shortest_file, "' allows: it holds ",
             info_.shortest_shard, " tokens, and a window needs seq-len + 1 = ", seq_len + 1,
             "; use --seq-len ", info_.shortest_shard - 1,
             " or less, or convert with fewer --shards");
  seq_len_ = seq_len;
  offsets_.assign(1, 0);
  for (const auto& s : shards_)
    offsets_.push_back(offsets_.back() + (s->info().num_tokens - 1) / seq_len);
}

void TokenDataset::read_windows(const int64_t* idx, int64_t n, int32_t* x, int32_t* y) {
  RT_CHECK(seq_len_ > 0, "read_windows before set_seq_len");
  const int64_t t = seq_len_;
  std::vector<uint32_t> buf(size_t(t + 1));  // per call: loaders may share the dataset
  for (int64_t i = 0; i < n; ++i) {
    RT_CHECK(idx[i] >= 0 && idx[i] < num_windows(), "window index ", idx[i], " outside [0, ",
             num_windows(), ") in ", info_.path);
    const size_t s =
        size_t(std::upper_bound(offsets_.begin(), offsets_.end(), idx[i]) - offsets_.begin() - 1);
    const int64_t lo = (idx[i] - offsets_[s]) * t;
    shards_[s]->read(lo, t + 1, buf.data());
    for (int64_t k = 0; k <= t; ++k)
      RT_REQUIRE(buf[size_t(k)] < uint64_t(info_.vocab_size), "token dataset '", shards_[s]->path(),
                 "': token ", buf[size_t(k)], " at position ", lo + k,
                 " is outside the vocabulary [0, vocab_size=", info_.vocab_size, ")");
    std::copy(buf.begin(), buf.end() - 1, x + i * t);
    std::copy(buf.begin() + 1, buf.end(), y + i * t);
  }
}

void require_data_kind(const std::string& path, DataKind have, DataKind want,
                       const std::string& who) {
  if (have == DataKind::unknown) return;  // the reader of the wanted kind says what is wrong
  RT_REQUIRE(
      have == want, "dataset '", path, "' holds ",
      have == DataKind::tokens ? "a token stream" : "images and labels", ", but ", who, " takes ",
      want == DataKind::tokens ? "tokens (convert text with `ringtrain convert text`)"
                               : "images and labels (`ringtrain convert idx|npy|images|cifar`)");
}

void require_tokens_fit_model(const TokenDatasetInfo& info, int64_t seq_len, int64_t model_vocab,
                              int64_t model_context, const std::string& model) {
  RT_REQUIRE(info.vocab_size <= model_vocab, "token dataset '", info.path, "' has vocab_size ",
             info.vocab_size, ", larger than model '", model, "''s embedding of ", model_vocab,
             " tokens; use a model with a vocabulary of at least ", info.vocab_size);
  RT_REQUIRE(seq_len <= model_context, "--seq-len ", seq_len, " is longer than model '", model,
             "''s context of ", model_context, " positions (for data '", info.path,
             "'); use --seq-len ", model_context, " or less");
}

std::string TokenizerId::describe() const {
  const std::string vocab = vocab_size > 0 ? cat("vocabulary ", vocab_size) : "";
  if (sha256.empty()) return vocab.empty() ? kind : cat(kind, " (", vocab, ")");
  return cat(kind, " (sha256 ", sha256.substr(0, 12), "...", vocab.empty() ? "" : ", ", vocab, ")");
}

TokenizerId tokenizer_id_of(const TokenDatasetInfo& info) {
  return {info.tokenizer, info.tokenizer_sha256, info.vocab_size};
}

void require_same_tokenizer(const TokenizerId& a, const std::string& a_what, const TokenizerId& b,
                            const std::string& b_what) {
  RT_REQUIRE(a == b, b_what, " was encoded with tokenizer ", b.describe(), ", but ", a_what,
             " with ", a.describe(),
             "; convert both with the same --tokenizer model (`ringtrain convert text`)");
}

void write_token_file(const std::string& path, const uint32_t* tokens, int64_t n,
                      const std::vector<int64_t>& docs, int64_t vocab_size,
                      const std::string& tokenizer, const std::string& split,
                      const TokenizerRecord* record) {
  RT_CHECK(n >= 1 && !docs.empty() && docs.front() == 0 && docs.back() < n, "token file of ", n,
           " tokens and ", docs.size(), " documents");
  H5Lock lock;
  H5Id file = create_file(path);
  write_attr(file, "format", std::string(kTokensFormat));
  write_attr(file, "format_version", kTokensVersion);
  write_attr(file, "vocab_size", vocab_size);
  write_attr(file, "tokenizer", tokenizer);
  write_attr(file, "split", split);
  if (record) {
    write_attr(file, "tokenizer_sha256", record->sha256);
    write_attr(file, "eot_id", record->eot_id);
    const std::string& b = record->model_bytes;
    write_dataset(file, "tokenizer_model",
                  Tensor(const_cast<char*>(b.data()), {int64_t(b.size())}, DType::u8));
  }
  const hid_t type = vocab_size <= 256     ? H5T_NATIVE_UINT8
                     : vocab_size <= 65536 ? H5T_NATIVE_UINT16
                                           : H5T_NATIVE_UINT32;
  const hsize_t dims = hsize_t(n), width = H5Tget_size(type);
  const hsize_t chunk = std::min<hsize_t>(dims, (hsize_t(1) << 20) / width);
  H5Id space(H5_CHECK(H5Screate_simple(1, &dims, nullptr)));
  H5Id dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  H5_CHECK(H5Pset_chunk(dcpl, 1, &chunk));
  H5Id ds(H5_CHECK(H5Dcreate2(file, "tokens", type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
  H5_CHECK(H5Dwrite(ds, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens));
  // Closing writes the chunks HDF5 still caches: a full disk often shows only here.
  ds.close(cat("dataset 'tokens' of '", path, "'"));
  std::vector<int64_t> offsets = docs;
  offsets.push_back(n);
  write_dataset(file, "doc_offsets", Tensor(offsets.data(), {int64_t(offsets.size())}, DType::i64));
  file.close(cat("'", path, "'"));
}

}  // namespace ringtrain::io
