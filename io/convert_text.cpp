// Text to token datasets: input expansion, the byte tokenizer, the validation split and
// the shard writer (see convert_text.hpp).
#include "io/convert_text.hpp"

#include <fnmatch.h>
#include <glob.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "core/error.hpp"
#include "core/files.hpp"
#include "io/convert_output.hpp"
#include "io/output_file.hpp"
#include "io/tokenizer.hpp"
#include "io/tokens.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {

namespace {

constexpr int64_t kByteVocab = 256;

// The regular files under `dir`, recursively, whose path matches `pattern` (fnmatch with
// '*' crossing '/', so "**/" has become "*" in it), in name order.
std::vector<std::string> walk(const std::string& dir, const std::string& pattern) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string p = it->path().string();
    if (pattern.empty() || fnmatch(pattern.c_str(), p.c_str(), 0) == 0) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> expand_one(const std::string& spec) {
  std::error_code ec;
  if (fs::is_directory(spec, ec)) return walk(spec, "");
  if (fs::exists(spec, ec) || spec.find_first_of("*?[") == std::string::npos) return {spec};
  const size_t star2 = spec.find("**");
  if (star2 != std::string::npos) {
    // The directory before the first "**", walked; the rest matched as one pattern.
    const size_t slash = spec.rfind('/', star2);
    const std::string root = slash == std::string::npos ? "." : spec.substr(0, slash + 1);
    const std::string raw = slash == std::string::npos ? std::string("./").append(spec) : spec;
    std::string pattern;  // "**/" and "**" become "*", which fnmatch lets cross '/'
    for (size_t i = 0; i < raw.size();) {
      const size_t skip = raw.compare(i, 3, "**/") == 0 ? 3 : raw.compare(i, 2, "**") == 0 ? 2 : 0;
      pattern += skip ? '*' : raw[i];
      i += skip ? skip : 1;
    }
    std::vector<std::string> files = walk(root, pattern);
    if (slash == std::string::npos)
      for (auto& f : files) f.erase(0, f.compare(0, 2, "./") == 0 ? 2 : 0);
    return files;
  }
  std::vector<std::string> files;
  glob_t g{};
  if (glob(spec.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i)
      if (fs::is_regular_file(g.gl_pathv[i], ec)) files.push_back(g.gl_pathv[i]);
  globfree(&g);
  return files;  // glob sorts
}

}  // namespace

std::vector<std::string> expand_text_inputs(const std::vector<std::string>& inputs) {
  RT_REQUIRE(!inputs.empty(), "--input: expected at least one text file, directory or glob");
  std::vector<std::string> files;
  for (const auto& spec : inputs) {
    std::vector<std::string> got = expand_one(spec);
    RT_REQUIRE(!got.empty(), "--input '", spec, "' matches no file");
    files.insert(files.end(), got.begin(), got.end());
  }
  return files;
}

std::vector<std::pair<int64_t, int64_t>> validation_ranges(const std::vector<int64_t>& docs,
                                                           int64_t num_tokens, double fraction) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (fraction <= 0) return out;
  const int64_t n = int64_t(docs.size());
  if (std::floor(double(n) * fraction) >= 1) {
    for (int64_t i = 0; i < n; ++i) {
      if (std::floor(double(i + 1) * fraction) <= std::floor(double(i) * fraction)) continue;
      const int64_t lo = docs[size_t(i)], hi = i + 1 < n ? docs[size_t(i + 1)] : num_tokens;
      if (!out.empty() && out.back().second == lo)
        out.back().second = hi;  // adjacent held-out documents: one range
      else
        out.emplace_back(lo, hi);
    }
    return out;
  }
  const int64_t held = std::llround(double(num_tokens) * fraction);
  if (held > 0) out.emplace_back(num_tokens - held, num_tokens);
  return out;
}

std::string validation_name(const std::string& out) {
  std::string stem = out;
  if (stem.size() > 3 && stem.compare(stem.size() - 3, 3, ".h5") == 0) stem.resize(stem.size() - 3);
  return stem + "-val.h5";
}

namespace {

// The part [lo, hi) of a stream with document starts `docs` (sorted; the first is 0) as its
// own stream: its tokens appended to `tokens`, its document starts (shifted) to `starts`.
void append_part(const std::vector<uint32_t>& all, const std::vector<int64_t>& docs, int64_t lo,
                 int64_t hi, std::vector<uint32_t>& tokens, std::vector<int64_t>& starts) {
  const int64_t base = int64_t(tokens.size());
  starts.push_back(base);  // the part begins a document (or the rest of one)
  for (auto it = std::upper_bound(docs.begin(), docs.end(), lo); it != docs.end() && *it < hi; ++it)
    starts.push_back(base + (*it - lo));
  tokens.insert(tokens.end(), all.begin() + lo, all.begin() + hi);
}

// The document starts of tokens [lo, hi) of a stream, relative to lo (the first is 0).
std::vector<int64_t> docs_within(const std::vector<int64_t>& starts, int64_t lo, int64_t hi) {
  std::vector<int64_t> out = {0};
  for (auto it = std::upper_bound(starts.begin(), starts.end(), lo); it != starts.end() && *it < hi;
       ++it)
    out.push_back(*it - lo);
  return out;
}

}  // namespace

TextConvertResult convert_text(const std::vector<std::string>& inputs, const std::string& out,
                               int shards, double val_fraction, uint64_t max_input_bytes,
                               const SentencePieceTokenizer* tokenizer, int threads) {
  RT_REQUIRE(val_fraction >= 0 && val_fraction < 1, "--val-fraction ", val_fraction,
             " is not valid; expected a fraction in [0, 1), e.g. 0.1");
  const std::vector<std::string> files = expand_text_inputs(inputs);
  // Sizes first: a FIFO or device (convert text --input /dev/zero) is refused, and a corpus
  // past the limit is refused before anything is read (each byte becomes a 4-byte token).
  uint64_t bytes_in = 0;
  for (const auto& f : files) bytes_in += require_regular_file(f, "--input", "a text file");
  RT_REQUIRE(bytes_in <= max_input_bytes, "--input: ", files.size(), " file(s) of ", bytes_in,
             " bytes in all; at most ", max_input_bytes,
             " bytes are converted at once (about 9 bytes of memory per input byte); raise "
             "--max-input-mb, or convert the corpus in parts");
  // Empty files add no document.
  std::vector<std::string> texts;
  texts.reserve(files.size());
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    RT_REQUIRE(in, "--input '", f, "' cannot be read");
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    RT_REQUIRE(!in.bad(), "--input '", f, "': read error");
    if (!bytes.empty()) texts.push_back(std::move(bytes));
  }
  std::vector<uint32_t> all;
  std::vector<int64_t> docs;
  int64_t vocab = kByteVocab;
  const auto t0 = std::chrono::steady_clock::now();
  if (!tokenizer) {  // the byte tokenizer: token = byte value
    all.reserve(size_t(bytes_in));
    for (const auto& text : texts) {
      docs.push_back(int64_t(all.size()));
      for (char c : text) all.push_back(uint32_t(static_cast<unsigned char>(c)));
    }
  } else {
    vocab = tokenizer->vocab_size();
    const int64_t eot = tokenizer->eos_id();
    RT_REQUIRE(eot >= 0 && eot < vocab,
               "--tokenizer: the SentencePiece model has no end-of-text "
               "(eos) piece; train one with `ringtrain tokenizer train` (eos is id 2)");
    // Documents shared out to the threads by an atomic counter, longest first, so that no
    // long document starts last while the other threads idle.
    std::vector<std::vector<uint32_t>> ids(texts.size());
    std::vector<size_t> order(texts.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return texts[a].size() > texts[b].size(); });
    std::atomic<size_t> next{0};
    std::vector<std::string> errors(size_t(std::max(1, threads)));
    auto work = [&](size_t w) {
      try {
        for (size_t k; (k = next++) < texts.size();)
          tokenizer->encode(texts[order[k]], ids[order[k]]);
      } catch (const std::exception& e) {
        errors[w] = e.what();
        next = texts.size();
      }
    };
    std::vector<std::thread> pool;
    for (size_t w = 1; w < errors.size(); ++w) pool.emplace_back(work, w);
    work(0);
    for (auto& t : pool) t.join();
    for (const auto& e : errors) RT_CHECK(e.empty(), e);
    size_t n = 0;
    for (const auto& v : ids) n += v.size() + 1;
    all.reserve(n);
    for (auto& v : ids) {
      docs.push_back(int64_t(all.size()));
      all.insert(all.end(), v.begin(), v.end());
      all.push_back(uint32_t(eot));
      std::vector<uint32_t>().swap(v);
    }
  }
  TextConvertResult r;
  r.encode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& text : texts) r.input_bytes += int64_t(text.size());
  std::vector<std::string>().swap(texts);
  r.vocab_size = vocab;
  r.tokenizer = tokenizer ? kSentencePieceKind : "bytes";
  std::string named;
  for (const auto& s : inputs) named += (named.empty() ? "'" : ", '") + s + "'";
  const int64_t total = int64_t(all.size());
  RT_REQUIRE(total > 0, "--input ", named, ": the corpus is empty (", files.size(),
             " file(s), 0 bytes); expected text to tokenise");

  r.files = int64_t(files.size());
  r.documents = int64_t(docs.size());
  const auto held = validation_ranges(docs, total, val_fraction);
  std::vector<uint32_t> train, val;
  std::vector<int64_t> train_docs, val_docs;
  int64_t at = 0;
  for (const auto& [lo, hi] : held) {
    if (lo > at) append_part(all, docs, at, lo, train, train_docs);
    append_part(all, docs, lo, hi, val, val_docs);
    at = hi;
  }
  if (at < total) append_part(all, docs, at, total, train, train_docs);
  r.train_tokens = int64_t(train.size());
  r.val_tokens = int64_t(val.size());
  r.val_documents = int64_t(val_docs.size());
  RT_REQUIRE(r.train_tokens > 0, "--val-fraction ", val_fraction, " leaves no training tokens of ",
             total, " in ", named, "; use a smaller fraction");
  RT_REQUIRE(val_fraction == 0 || r.val_tokens > 0, "--val-fraction ", val_fraction,
             " holds out no tokens of ", total, " in ", named, "; use a larger fraction");
  RT_REQUIRE(shards >= 1 && shards <= r.train_tokens, "--shards ", shards, " is not valid for ",
             r.train_tokens, " training tokens; expected 1 to ", r.train_tokens);

  const fs::path parent = fs::path(out).parent_path();  // like `mkdir -p`, as convert idx
  std::error_code mk;
  if (!parent.empty()) fs::create_directories(parent, mk);
  RT_REQUIRE(parent.empty() || fs::is_directory(parent), "--out '", out, "': directory '",
             parent.string(), "' cannot be created", mk ? cat(" (", mk.message(), ")") : "");
  r.train_files = shard_names(out, shards);
  TokenizerRecord record;
  if (tokenizer) record = {tokenizer->model_bytes(), tokenizer->sha256(), tokenizer->eos_id()};
  const TokenizerRecord* rec = tokenizer ? &record : nullptr;
  if (!val.empty()) r.val_file = validation_name(out);
  std::vector<std::string> all_files = r.train_files;
  if (!r.val_file.empty()) all_files.push_back(r.val_file);
  // Written under .tmp names, renamed when every file is complete: a failed conversion
  // leaves nothing that looks like a dataset.
  write_outputs(all_files, [&](std::string* current) {
    for (int s = 0; s < shards; ++s) {
      const int64_t lo = r.train_tokens * s / shards, hi = r.train_tokens * (s + 1) / shards;
      *current = r.train_files[size_t(s)];
      write_token_file(r.train_files[size_t(s)] + ".tmp", train.data() + lo, hi - lo,
                       docs_within(train_docs, lo, hi), vocab, r.tokenizer, "train", rec);
    }
    if (!val.empty()) {
      *current = r.val_file;
      write_token_file(r.val_file + ".tmp", val.data(), r.val_tokens, val_docs, vocab, r.tokenizer,
                       "val", rec);
    }
  });
  return r;
}

}  // namespace ringtrain::io
