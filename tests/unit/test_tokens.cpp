// Token datasets without MPI: `convert text` output read back with plain HDF5 calls (bytes,
// document offsets, attributes, shards, the validation split), the window reads, the
// window loader's order (independent of the rank count, resumable at any step, the same
// with prefetch), the bad-input errors (empty corpus, seq-len longer than a shard, a token
// outside the vocabulary, an image file given as tokens and the reverse) and the smoothed
// unigram/bigram baselines against values worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>

#include "io/convert_text.hpp"
#include "io/dataset.hpp"
#include "io/hdf5.hpp"
#include "io/loader.hpp"
#include "io/token_baselines.hpp"
#include "io/tokens.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {
namespace {

class TokensTest : public testing::Test {
 protected:
  void SetUp() override {
    silence_hdf5_errors();
    char tmpl[] = "/tmp/ringtrain-tokens-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string write_text(const std::string& name, const std::string& bytes) {
    const std::string p = path(name);
    fs::create_directories(fs::path(p).parent_path());
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  template <typename F>
  void expect_input_error(F f, const std::string& want) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one naming '" << want << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::input) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  std::string dir_;
};

// /tokens as bytes and /doc_offsets, read with HDF5 calls of the test's own.
struct RawTokens {
  std::string tokens;
  std::vector<int64_t> docs;
  std::string format, tokenizer, split;
  int64_t vocab = 0;
  size_t width = 0;
};
RawTokens read_raw(const std::string& file) {
  RawTokens r;
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0) << file;
  hid_t ds = H5Dopen2(f, "tokens", H5P_DEFAULT);
  hid_t type = H5Dget_type(ds);
  r.width = H5Tget_size(type);
  hid_t space = H5Dget_space(ds);
  r.tokens.resize(size_t(H5Sget_simple_extent_npoints(space)));
  H5Dread(ds, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, r.tokens.data());
  H5Sclose(space);
  H5Tclose(type);
  H5Dclose(ds);
  ds = H5Dopen2(f, "doc_offsets", H5P_DEFAULT);
  space = H5Dget_space(ds);
  r.docs.resize(size_t(H5Sget_simple_extent_npoints(space)));
  H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, r.docs.data());
  H5Sclose(space);
  H5Dclose(ds);
  r.format = read_attr_string(f, "format").value_or("");
  r.tokenizer = read_attr_string(f, "tokenizer").value_or("");
  r.split = read_attr_string(f, "split").value_or("");
  r.vocab = read_attr_int(f, "vocab_size").value_or(0);
  H5Fclose(f);
  return r;
}

TEST_F(TokensTest, ConvertTextStoresEveryByteAndTheDocumentStarts) {
  // Not UTF-8 (0xff, 0xc3 alone) and a NUL: the byte tokenizer keeps them as they are.
  const std::string a = "hello\n", b = std::string("x\xff\0\xc3y", 5), c = "last doc\n";
  write_text("in/a.txt", a);
  write_text("in/b.txt", b);
  write_text("in/empty.txt", "");  // no document
  write_text("in/c.txt", c);
  const auto r = convert_text({path("in/*.txt")}, path("out/t.h5"), 1, 0.0);
  ASSERT_EQ(r.train_files, std::vector<std::string>{path("out/t.h5")});
  EXPECT_TRUE(r.val_file.empty());
  EXPECT_EQ(r.files, 4);
  EXPECT_EQ(r.documents, 3);
  const RawTokens raw = read_raw(path("out/t.h5"));
  EXPECT_EQ(raw.tokens, a + b + c);
  EXPECT_EQ(raw.docs, (std::vector<int64_t>{0, 6, 11, 20}));
  EXPECT_EQ(raw.format, "ringtrain-tokens");
  EXPECT_EQ(raw.tokenizer, "bytes");
  EXPECT_EQ(raw.split, "train");
  EXPECT_EQ(raw.vocab, 256);
  EXPECT_EQ(raw.width, 1u) << "vocabulary 256 is stored as uint8";
  EXPECT_FALSE(fs::exists(path("out/t.h5.tmp")));
}

TEST_F(TokensTest, RecursiveGlobsAndDirectoriesExpandInNameOrder) {
  write_text("src/z.py", "z");
  write_text("src/pkg/a.py", "a");
  write_text("src/pkg/deep/b.py", "b");
  write_text("src/pkg/notes.txt", "n");
  EXPECT_EQ(expand_text_inputs({path("src/**/*.py")}),
            (std::vector<std::string>{path("src/pkg/a.py"), path("src/pkg/deep/b.py"),
                                      path("src/z.py")}));
  EXPECT_EQ(expand_text_inputs({path("src/pkg")}),
            (std::vector<std::string>{path("src/pkg/a.py"), path("src/pkg/deep/b.py"),
                                      path("src/pkg/notes.txt")}));
  expect_input_error([&] { expand_text_inputs({path("src/*.md")}); }, "src/*.md' matches no file");
}

TEST_F(TokensTest, ValidationSplitTakesEveryKthDocumentOrTheTail) {
  std::vector<std::string> docs;
  for (int i = 0; i < 10; ++i) {
    docs.push_back(std::string(size_t(3 + i), char('a' + i)));
    write_text("d/" + std::to_string(i) + ".txt", docs.back());
  }
  // F = 0.2 over 10 documents: floor((i + 1) F) > floor(i F) holds for i = 4 and 9.
  const auto r = convert_text({path("d/?.txt")}, path("s.h5"), 2, 0.2);
  ASSERT_EQ(r.val_file, path("s-val.h5"));
  EXPECT_EQ(r.val_documents, 2);
  const RawTokens val = read_raw(r.val_file);
  EXPECT_EQ(val.tokens, docs[4] + docs[9]);
  EXPECT_EQ(val.docs, (std::vector<int64_t>{0, 7, 19}));
  EXPECT_EQ(val.split, "val");
  // The training stream (the other 8 documents) split in two shards at L / 2.
  std::string train;
  for (int i = 0; i < 10; ++i)
    if (i != 4 && i != 9) train += docs[size_t(i)];
  ASSERT_EQ(r.train_files,
            (std::vector<std::string>{path("s-00000-of-00002.h5"), path("s-00001-of-00002.h5")}));
  const RawTokens s0 = read_raw(r.train_files[0]), s1 = read_raw(r.train_files[1]);
  EXPECT_EQ(s0.tokens + s1.tokens, train);
  EXPECT_EQ(int64_t(s0.tokens.size()), int64_t(train.size()) / 2);
  // Documents of 3, 4, 5, 6, 8, 9, 10, 11 bytes start at 0, 3, 7, 12, 18, 26, 35, 45; the
  // cut at 28 falls inside the one at 26, so shard 1 starts mid-document.
  EXPECT_EQ(s0.docs, (std::vector<int64_t>{0, 3, 7, 12, 18, 26, 28}));
  EXPECT_EQ(s1.docs, (std::vector<int64_t>{0, 7, 17, 28}));

  // One document: its last round(L F) bytes.
  write_text("one.txt", "0123456789abcdefghij");
  const auto t = convert_text({path("one.txt")}, path("one.h5"), 1, 0.25);
  EXPECT_EQ(read_raw(t.val_file).tokens, "fghij");
  EXPECT_EQ(read_raw(t.train_files[0]).tokens, "0123456789abcde");
}

TEST_F(TokensTest, EmptyCorpusAndImpossibleSplitsAreInputErrors) {
  write_text("e/a.txt", "");
  write_text("e/b.txt", "");
  expect_input_error([&] { convert_text({path("e/*.txt")}, path("x.h5"), 1, 0.1); },
                     "the corpus is empty (2 file(s), 0 bytes)");
  expect_input_error([&] { convert_text({path("e/*.txt")}, path("x.h5"), 1, 0.1); },
                     path("e/*.txt"));
  write_text("tiny.txt", "abc");
  expect_input_error([&] { convert_text({path("tiny.txt")}, path("x.h5"), 1, 0.1); },
                     "holds out no tokens of 3");
  expect_input_error([&] { convert_text({path("tiny.txt")}, path("x.h5"), 4, 0.0); },
                     "--shards 4 is not valid for 3 training tokens");
  expect_input_error([&] { convert_text({path("tiny.txt")}, path("x.h5"), 1, 1.0); },
                     "--val-fraction 1");
  EXPECT_FALSE(fs::exists(path("x.h5")));
}

// A stream of n tokens where token i = (i * 31 + i / 256) % 256, as `shards` files.
std::vector<std::string> write_stream(const std::string& out, int64_t n, int shards) {
  std::vector<uint32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = uint32_t((i * 31 + i / 256) % 256);
  std::vector<std::string> files;
  for (int s = 0; s < shards; ++s) {
    const int64_t lo = n * s / shards, hi = n * (s + 1) / shards;
    files.push_back(out + "-" + std::to_string(s) + ".h5");
    write_token_file(files.back(), t.data() + lo, hi - lo, {0}, 256, "bytes", "train");
  }
  return files;
}
uint32_t stream_token(int64_t i) { return uint32_t((i * 31 + i / 256) % 256); }

TEST_F(TokensTest, WindowsTileEachShardAndTargetsAreTheNextTokens) {
  write_stream(path("w"), 1000, 2);  // shards of 500 tokens
  TokenDataset d(path("w-*.h5"));
  EXPECT_EQ(d.info().num_tokens, 1000);
  d.set_seq_len(16);
  EXPECT_EQ(d.num_windows(), 2 * (499 / 16));  // 31 per shard
  const std::vector<int64_t> idx = {0, 30, 31, 61, 5, 5};
  std::vector<int32_t> x(idx.size() * 16), y(idx.size() * 16);
  d.read_windows(idx.data(), int64_t(idx.size()), x.data(), y.data());
  for (size_t j = 0; j < idx.size(); ++j) {
    const int64_t shard = idx[j] / 31, start = shard * 500 + (idx[j] % 31) * 16;
    for (int64_t k = 0; k < 16; ++k) {
      ASSERT_EQ(uint32_t(x[j * 16 + size_t(k)]), stream_token(start + k)) << "window " << idx[j];
      ASSERT_EQ(uint32_t(y[j * 16 + size_t(k)]), stream_token(start + k + 1))
          << "window " << idx[j];
    }
  }
}

TEST_F(TokensTest, SeqLenLongerThanTheShortestShardNamesItAndItsLength) {
  std::vector<uint32_t> t(100, 7);
  write_token_file(path("a.h5"), t.data(), 100, {0}, 256, "bytes", "train");
  write_token_file(path("b.h5"), t.data(), 40, {0}, 256, "bytes", "train");
  TokenDataset d(dir_);
  d.set_seq_len(39);  // 40 tokens hold one window of 39 + 1
  expect_input_error([&] { d.set_seq_len(40); },
                     "'" + path("b.h5") + "' allows: it holds 40 tokens");
  expect_input_error([&] { d.set_seq_len(0); }, "--seq-len 0");
}

TEST_F(TokensTest, TokenOutsideTheVocabularyNamesFileAndPosition) {
  std::vector<uint32_t> t(50, 3);
  t[37] = 900;
  const std::string p = path("v.h5");
  write_token_file(p, t.data(), 50, {0}, 1000, "custom", "train");
  {  // shrink the declared vocabulary below the stored token
    H5Lock lock;
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Adelete(f, "vocab_size");
    write_attr(f, "vocab_size", int64_t(500));
    H5Fclose(f);
  }
  TokenDataset d(p);
  EXPECT_EQ(d.shard(0).info().token_bytes, 2) << "vocabulary 1000 is stored as uint16";
  d.set_seq_len(10);
  std::vector<int32_t> x(10), y(10);
  const int64_t w = 3;  // tokens 30..40
  expect_input_error([&] { d.read_windows(&w, 1, x.data(), y.data()); },
                     "token 900 at position 37 is outside the vocabulary [0, vocab_size=500)");
}

TEST_F(TokensTest, ImageAndTokenFilesAreNotTakenForEachOther) {
  std::vector<uint32_t> t(50, 3);
  write_token_file(path("tok.h5"), t.data(), 50, {0}, 256, "bytes", "train");
  std::vector<uint8_t> img(4 * 6, 1);
  std::vector<int32_t> lab = {0, 1, 0, 1};
  write_dataset_files(path("img.h5"), img.data(), {4, 1, 2, 3}, lab.data(), 2);
  EXPECT_EQ(data_kind_of(path("tok.h5")), DataKind::tokens);
  EXPECT_EQ(data_kind_of(path("img.h5")), DataKind::images);
  expect_input_error([&] { TokenDataset d(path("img.h5")); }, "holds images and labels");
  expect_input_error([&] { Dataset d(path("tok.h5")); }, "holds a token stream");
}

TEST_F(TokensTest, ModelFitChecksNameTheFileTheModelAndTheNumbers) {
  TokenDatasetInfo info;
  info.path = "data/py-val.h5";
  info.vocab_size = 256;
  require_tokens_fit_model(info, 64, 256, 64, "gpt-tiny");  // fits exactly
  expect_input_error(
      [&] { require_tokens_fit_model(info, 64, 128, 64, "small"); },
      "'data/py-val.h5' has vocab_size 256, larger than model 'small''s embedding of "
      "128 tokens");
  expect_input_error([&] { require_tokens_fit_model(info, 65, 256, 64, "gpt-tiny"); },
                     "--seq-len 65 is longer than model 'gpt-tiny''s context of 64 positions");
  require_data_kind("t.h5", DataKind::tokens, DataKind::tokens, "model 'gpt-tiny'");
  expect_input_error(
      [&] { require_data_kind("i.h5", DataKind::images, DataKind::tokens, "model 'gpt-tiny'"); },
      "dataset 'i.h5' holds images and labels, but model 'gpt-tiny' takes tokens");
  expect_input_error(
      [&] { require_data_kind("t.h5", DataKind::tokens, DataKind::images, "model 'mlp'"); },
      "dataset 't.h5' holds a token stream, but model 'mlp' takes images");
}

// The windows of `steps` global batches, gathered from W loaders (one per rank).
std::vector<int32_t> windows_seen(TokenDataset& d, int world, int64_t global, int steps,
                                  int64_t start_epoch = 0, int64_t start_pos = 0,
                                  int prefetch = 0) {
  std::vector<std::unique_ptr<Loader>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::make_unique<Loader>(d, 11, global, r, world, prefetch));
    ranks.back()->seek(start_epoch, start_pos);
  }
  std::vector<int32_t> out;
  for (int s = 0; s < steps; ++s)
    for (auto& l : ranks) {
      const Batch& b = l->next();
      EXPECT_EQ(b.kind, DataKind::tokens);
      EXPECT_EQ(b.x.shape, (Shape{global / world, d.seq_len()}));
      EXPECT_EQ(b.x.dtype, DType::i32);
      out.insert(out.end(), b.x.as<int32_t>(), b.x.as<int32_t>() + b.x.numel());
      // The targets are the next tokens: y[i][k] = x[i][k + 1].
      for (int64_t i = 0; i < b.x.shape[0]; ++i)
        for (int64_t k = 0; k + 1 < d.seq_len(); ++k)
          EXPECT_EQ(b.y.as<int32_t>()[i * d.seq_len() + k],
                    b.x.as<int32_t>()[i * d.seq_len() + k + 1]);
    }
  return out;
}

TEST_F(TokensTest, LoaderOrderIsTheSameOnAnyRankCountAndResumes) {
  write_stream(path("l"), 3000, 3);
  TokenDataset d(path("l-*.h5"));
  d.set_seq_len(8);  // 3 x 124 = 372 windows; 12 steps of 48 cross an epoch end (7 / epoch)
  ASSERT_EQ(d.num_windows(), 372);
  const auto one = windows_seen(d, 1, 48, 12);
  EXPECT_EQ(windows_seen(d, 2, 48, 12), one);
  EXPECT_EQ(windows_seen(d, 4, 48, 12), one);
  EXPECT_EQ(windows_seen(d, 3, 48, 12, 0, 0, /*prefetch=*/2), one);
  // Stop after step 9 (epoch 1, position 2 * 48), resume from there on 2 ranks.
  Loader probe(d, 11, 48, 0, 1);
  for (int s = 0; s < 9; ++s) probe.next();
  ASSERT_EQ(probe.epoch(), 1);
  ASSERT_EQ(probe.position(), 96);
  const auto rest = windows_seen(d, 2, 48, 3, probe.epoch(), probe.position());
  const size_t per_step = 48 * 8;
  EXPECT_EQ(rest, std::vector<int32_t>(one.begin() + 9 * per_step, one.end()));
  // A different seed is a different order (the test can tell orders apart).
  Loader other(d, 12, 48, 0, 1);
  const Batch& b = other.next();
  EXPECT_NE(std::vector<int32_t>(b.x.as<int32_t>(), b.x.as<int32_t>() + b.x.numel()),
            std::vector<int32_t>(one.begin(), one.begin() + per_step));
  expect_input_error([&] { Loader l(d, 1, 400, 0, 1); }, "(372 windows of 8 tokens)");
}

TEST_F(TokensTest, BaselinesMatchHandComputedSmoothedCrossEntropy) {
  const std::vector<uint32_t> train = {0, 1, 0, 1}, val = {0, 1, 1};
  write_token_file(path("tr.h5"), train.data(), 4, {0}, 256, "bytes", "train");
  write_token_file(path("va.h5"), val.data(), 3, {0}, 256, "bytes", "val");
  TokenDataset tr(path("tr.h5")), va(path("va.h5"));
  const NgramCounts c = count_ngrams(tr);
  EXPECT_EQ(c.tokens, 4);
  // Targets: (prev 0, 1) and (prev 1, 1). Unigram p(1) = (2 + 1) / (4 + 256) twice.
  // Bigram p(1 | 0) = (2 + 1) / (2 + 256); p(1 | 1) = (0 + 1) / (1 + 256).
  const BaselineLoss b = baseline_loss(c, va, 0);
  EXPECT_EQ(b.targets, 2);
  EXPECT_NEAR(b.unigram, std::log(260.0 / 3.0), 1e-12);
  EXPECT_NEAR(b.bigram, (std::log(258.0 / 3.0) + std::log(257.0)) / 2, 1e-12);
  // With windows of 1 token: 2 windows, the same 2 targets; of 2 tokens: 1 window.
  EXPECT_EQ(baseline_loss(c, va, 1).targets, 2);
  const BaselineLoss w2 = baseline_loss(c, va, 2);
  EXPECT_EQ(w2.targets, 2);
  EXPECT_NEAR(w2.bigram, b.bigram, 1e-12);
  const std::vector<uint32_t> longer = {0, 1, 1, 0, 0};
  write_token_file(path("v5.h5"), longer.data(), 5, {0}, 256, "bytes", "val");
  TokenDataset v5(path("v5.h5"));
  EXPECT_EQ(baseline_loss(c, v5, 3).targets, 3) << "one window of 3: positions 1..3";
}

}  // namespace
}  // namespace ringtrain::io
