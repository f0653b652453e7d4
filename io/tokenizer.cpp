// SentencePiece behind ringtrain's tokenizer interface, through the module
// librt_sentencepiece.so (io/sentencepiece_module.cpp says why it is a deep-bound module),
// and SHA-256 by OpenSSL's libcrypto (see tokenizer.hpp).
#include "io/tokenizer.hpp"

#include <dlfcn.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>

#include "core/error.hpp"

namespace ringtrain::io {

namespace {

using Sink = void (*)(void* ctx, const char* data, size_t n);

// The module's functions, resolved once.
struct SpmModule {
  void* (*load)(const char*, size_t, char*, size_t);
  void (*free)(void*);
  int (*piece_size)(const void*);
  int (*eos_id)(const void*);
  int (*encode)(const void*, const char*, size_t, Sink, void*, char*, size_t);
  int (*decode)(const void*, const int*, size_t, Sink, void*, char*, size_t);
  int (*train)(const char* const*, const char* const*, size_t, const char* const*, size_t, Sink,
               void*, char*, size_t);
};

constexpr const char* kModuleName = "librt_sentencepiece.so";

// Beside the program (the build tree's bin/), else in ../lib/ringtrain (an installed tree).
const SpmModule& spm() {
  static SpmModule m;
  static std::once_flag once;
  std::call_once(once, [] {
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
    std::string tried;
    void* h = nullptr;
    for (const auto& p : {exe / kModuleName, exe / ".." / "lib" / "ringtrain" / kModuleName}) {
      tried += (tried.empty() ? "" : ", ") + p.string();
      if (!std::filesystem::exists(p, ec)) continue;
      h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      RT_CHECK(h, "dlopen(", p.string(), "): ", dlerror());
      break;
    }
    RT_CHECK(h, "the SentencePiece module ", kModuleName, " is not installed (looked at ", tried,
             ")");
    auto sym = [&](const char* name) {
      void* f = dlsym(h, name);
      RT_CHECK(f, "dlsym(", kModuleName, ", ", name, "): ", dlerror());
      return f;
    };
    m.load = reinterpret_cast<decltype(m.load)>(sym("rt_spm_load"));
    m.free = reinterpret_cast<decltype(m.free)>(sym("rt_spm_free"));
    m.piece_size = reinterpret_cast<decltype(m.piece_size)>(sym("rt_spm_piece_size"));
    m.eos_id = reinterpret_cast<decltype(m.eos_id)>(sym("rt_spm_eos_id"));
    m.encode = reinterpret_cast<decltype(m.encode)>(sym("rt_spm_encode"));
    m.decode = reinterpret_cast<decltype(m.decode)>(sym("rt_spm_decode"));
    m.train = reinterpret_cast<decltype(m.train)>(sym("rt_spm_train"));
  });
  return m;
}

void append_string(void* ctx, const char* data, size_t n) {
  static_cast<std::string*>(ctx)->append(data, n);
}

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  RT_CHECK(EVP_Digest(bytes.data(), bytes.size(), digest, &len, EVP_sha256(), nullptr) == 1,
           "EVP_Digest(sha256) of ", bytes.size(), " bytes failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

struct SentencePieceTokenizer::Impl {
  void* sp = nullptr;
  ~Impl() {
    if (sp) spm().free(sp);
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<Impl> impl, std::string bytes)
    : impl_(std::move(impl)), bytes_(std::move(bytes)), sha256_(sha256_hex(bytes_)) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;
SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept =
    default;

SentencePieceTokenizer SentencePieceTokenizer::from_bytes(std::string bytes,
                                                          const std::string& what) {
  auto impl = std::make_unique<Impl>();
  char err[512] = "";
  impl->sp = spm().load(bytes.data(), bytes.size(), err, sizeof err);
  RT_REQUIRE(impl->sp, what, " is not a SentencePiece model (", err,
             "); expected a .model file written by `ringtrain tokenizer train` or spm_train");
  const int pieces = spm().piece_size(impl->sp);
  RT_REQUIRE(pieces >= 2, what, " is a SentencePiece model of ", pieces,
             " pieces; expected a vocabulary of at least 2");
  return SentencePieceTokenizer(std::move(impl), std::move(bytes));
}

SentencePieceTokenizer SentencePieceTokenizer::from_file(const std::string& path,
                                                         const std::string& option) {
  std::ifstream in(path, std::ios::binary);
  RT_REQUIRE(in, option, " '", path, "' cannot be read; expected a SentencePiece .model file");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  RT_REQUIRE(!in.bad(), option, " '", path, "': read error");
  RT_REQUIRE(!bytes.empty(), option, " '", path,
             "' is empty; expected a SentencePiece .model file");
  return from_bytes(std::move(bytes), cat(option, " '", path, "'"));
}

int64_t SentencePieceTokenizer::vocab_size() const { return spm().piece_size(impl_->sp); }
int64_t SentencePieceTokenizer::eos_id() const { return spm().eos_id(impl_->sp); }

void SentencePieceTokenizer::encode(std::string_view text, std::vector<uint32_t>& out) const {
  std::string ids;  // the ids as the bytes of an int array
  char err[512] = "";
  RT_CHECK(
      spm().encode(impl_->sp, text.data(), text.size(), append_string, &ids, err, sizeof err) == 0,
      "SentencePiece encode of ", text.size(), " bytes: ", err);
  const size_t n = ids.size() / sizeof(int), at = out.size();
  out.resize(at + n);
  for (size_t i = 0; i < n; ++i) {
    int id;
    std::memcpy(&id, ids.data() + i * sizeof(int), sizeof id);
    out[at + i] = uint32_t(id);
  }
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  char err[512] = "";
  const std::vector<int> v(ids.begin(), ids.end());
  RT_CHECK(spm().decode(impl_->sp, v.data(), v.size(), append_string, &text, err, sizeof err) == 0,
           "SentencePiece decode of ", ids.size(), " ids: ", err);
  return text;
}

std::string train_sentencepiece(const TokenizerTrainSpec& spec) {
  RT_REQUIRE(spec.model_type == "bpe" || spec.model_type == "unigram", "--model-type '",
             spec.model_type, "' is not valid; expected bpe or unigram");
  const std::vector<std::pair<std::string, std::string>> args = {
      {"vocab_size", std::to_string(spec.vocab_size)},
      {"model_type", spec.model_type},
      {"num_threads", std::to_string(std::max(1, spec.threads))},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"byte_fallback", "true"},
      {"character_coverage", "1.0"},
      {"user_defined_symbols", "\n"},
      {"input_sentence_size", "2000000"},
      {"shuffle_input_sentence", "true"},
      {"minloglevel", "2"},
  };
  std::vector<const char*> keys, values, files;
  for (const auto& [k, v] : args) keys.push_back(k.c_str()), values.push_back(v.c_str());
  for (const auto& f : spec.files) files.push_back(f.c_str());
  std::string model;
  char err[1024] = "";
  const int rc = spm().train(keys.data(), values.data(), keys.size(), files.data(), files.size(),
                             append_string, &model, err, sizeof err);
  RT_REQUIRE(rc == 0, "ringtrain tokenizer train --vocab-size ", spec.vocab_size, " --model-type ",
             spec.model_type, ": SentencePiece refused: ", err);
  return model;
}

}  // namespace ringtrain::io
