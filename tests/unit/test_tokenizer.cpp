// The SentencePiece tokenizer behind `tokenizer train`, `convert text --tokenizer` and
// `sample`: SHA-256 against the FIPS 180-2 test vectors, a model trained here round-trips
// text it never saw (unicode, tabs, newlines, leading and repeated spaces) through encode and
// decode, a file that is not a model is refused naming it, bad training values are refused,
// and `convert text --tokenizer` ends every document with the eos id and records the model.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "io/convert_text.hpp"
#include "io/hdf5.hpp"
#include "io/tokenizer.hpp"
#include "io/tokens.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {
namespace {

class TokenizerTest : public testing::Test {
 protected:
  void SetUp() override {
    silence_hdf5_errors();
    char tmpl[] = "/tmp/ringtrain-tokenizer-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string write(const std::string& name, const std::string& bytes) {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  // A small corpus of code-like lines over 80 made-up words.
  std::vector<std::string> corpus() {
    std::vector<std::string> words;
    uint32_t x = 12345;
    for (int w = 0; w < 80; ++w) {
      std::string word;
      for (int k = 0, len = 3 + w % 6; k < len; ++k) {
        x = x * 1103515245u + 12345u;
        word += char('a' + (x >> 16) % 26);
      }
      words.push_back(word);
    }
    std::vector<std::string> files;
    for (int d = 0; d < 6; ++d) {
      std::string text;
      for (int i = 0; i < 300; ++i) {
        const auto& a = words[size_t(i * 7 + d) % 80];
        const auto& b = words[size_t(i * 13 + 3 * d) % 80];
        text += "def " + a + "_" + std::to_string(i % 17) + "(" + b + ", y):\n    return " + b +
                " * " + std::to_string(i * d % 13) + " + y  # " + a + "\n";
      }
      files.push_back(write("doc" + std::to_string(d) + ".py", text));
    }
    return files;
  }
  std::string dir_;
};

std::string input_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST_F(TokenizerTest, TrainedModelRoundTripsUnseenText) {
  for (const char* type : {"bpe", "unigram"}) {
    const std::string model = train_sentencepiece({corpus(), 320, type, 1});
    const auto tok = SentencePieceTokenizer::from_bytes(model, "test model");
    EXPECT_EQ(tok.vocab_size(), 320) << type;
    EXPECT_EQ(tok.eos_id(), 2) << type;
    EXPECT_EQ(tok.sha256(), sha256_hex(model));
    const std::string text =
        "  leading spaces,\ttabs,\n\nblank lines, unicode \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 "
        "and   repeated   spaces \n";
    std::vector<uint32_t> ids;
    tok.encode(text, ids);
    ASSERT_FALSE(ids.empty());
    for (uint32_t id : ids) ASSERT_LT(id, 320u) << type;
    EXPECT_EQ(tok.decode(std::vector<int32_t>(ids.begin(), ids.end())), text) << type;
    // The corpus is learnt: a document of it takes fewer tokens than bytes (the
    // vocabulary holds only 60 pieces beyond the bytes and the special ones).
    std::ifstream in(path("doc0.py"), std::ios::binary);
    const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ids.clear();
    tok.encode(doc, ids);
    EXPECT_LT(ids.size(), doc.size()) << type << ": " << ids.size() << " tokens";
  }
}

TEST_F(TokenizerTest, NotAModelIsAnInputErrorNamingTheFile) {
  const std::string bad = write("bad.model", "this is text, not a model\n");
  const std::string msg =
      input_error([&] { SentencePieceTokenizer::from_file(bad, "--tokenizer"); });
  EXPECT_NE(msg.find("--tokenizer '" + bad + "' is not a SentencePiece model"), std::string::npos)
      << msg;
  EXPECT_NE(input_error([&] {
              SentencePieceTokenizer::from_file(path("none"), "--tokenizer");
            }).find("cannot be read"),
            std::string::npos);
  EXPECT_NE(input_error([&] {
              train_sentencepiece({corpus(), 320, "wordpiece", 1});
            }).find("--model-type 'wordpiece'"),
            std::string::npos);
  // Too large a vocabulary for this corpus: SentencePiece's reason, with --vocab-size.
  EXPECT_NE(input_error([&] {
              train_sentencepiece({corpus(), 100000, "unigram", 1});
            }).find("--vocab-size 100000"),
            std::string::npos);
}

TEST_F(TokenizerTest, ConvertTextEndsEachDocumentWithEosAndRecordsTheModel) {
  const auto files = corpus();
  const std::string model = train_sentencepiece({files, 320, "bpe", 1});
  const auto tok = SentencePieceTokenizer::from_bytes(model, "test model");
  const auto r = convert_text(files, path("t.h5"), 1, 0.0, kDefaultMaxTextInputBytes, &tok, 3);
  std::vector<uint32_t> want;
  std::vector<int64_t> starts;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    starts.push_back(int64_t(want.size()));
    tok.encode(text, want);
    want.push_back(2);
  }
  starts.push_back(int64_t(want.size()));
  ASSERT_EQ(r.train_tokens, int64_t(want.size()));
  TokenShard shard(path("t.h5"));
  EXPECT_EQ(shard.info().tokenizer, "sentencepiece");
  EXPECT_EQ(shard.info().vocab_size, 320);
  EXPECT_EQ(shard.info().eot_id, 2);
  EXPECT_EQ(shard.info().tokenizer_sha256, sha256_hex(model));
  EXPECT_EQ(shard.tokenizer_model(), model);
  EXPECT_EQ(shard.doc_offsets(), starts);
  std::vector<uint32_t> got(want.size());
  shard.read(0, int64_t(got.size()), got.data());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(want[i], got[i]) << "at token " << i;
}

}  // namespace
}  // namespace ringtrain::io
