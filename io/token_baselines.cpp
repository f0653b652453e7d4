// Unigram and bigram counts and their smoothed cross-entropy (see token_baselines.hpp).
#include "io/token_baselines.hpp"

#include <cmath>

namespace ringtrain::io {

namespace {

constexpr int64_t kDenseVocab = 2048;  // V^2 counts of 8 bytes: 32 MiB at most
constexpr int64_t kBlock = int64_t(1) << 20;

// Calls f(prev, tok, position) for the tokens [from, to) of a shard (from >= 1), read in
// blocks; prev is the token before.
template <typename F>
void each_pair(TokenShard& shard, int64_t from, int64_t to, F&& f) {
  std::vector<uint32_t> buf;
  for (int64_t lo = from - 1; lo + 1 < to; lo += kBlock) {
    const int64_t n = std::min(kBlock + 1, to - lo);
    buf.resize(size_t(n));
    shard.read(lo, n, buf.data());
    for (int64_t k = 1; k < n; ++k) f(buf[size_t(k - 1)], buf[size_t(k)], lo + k);
  }
}

void require_in_vocab(uint32_t t, int64_t vocab, const TokenShard& shard, int64_t pos) {
  RT_REQUIRE(t < uint64_t(vocab), "token dataset '", shard.path(), "': token ", t, " at position ",
             pos, " is outside the vocabulary [0, vocab_size=", vocab, ")");
}

}  // namespace

int64_t NgramCounts::pair(uint32_t a, uint32_t b) const {
  if (!bigram.empty()) return bigram[size_t(a) * size_t(vocab) + b];
  const auto it = sparse.find(uint64_t(a) << 32 | b);
  return it == sparse.end() ? 0 : it->second;
}

NgramCounts count_ngrams(TokenDataset& data) {
  NgramCounts c;
  c.vocab = data.info().vocab_size;
  c.unigram.assign(size_t(c.vocab), 0);
  c.first.assign(size_t(c.vocab), 0);
  if (c.vocab <= kDenseVocab) c.bigram.assign(size_t(c.vocab * c.vocab), 0);
  for (int64_t s = 0; s < data.info().num_shards; ++s) {
    TokenShard& shard = data.shard(size_t(s));
    uint32_t head = 0;
    shard.read(0, 1, &head);
    require_in_vocab(head, c.vocab, shard, 0);
    ++c.unigram[head];
    each_pair(shard, 1, shard.info().num_tokens, [&](uint32_t a, uint32_t b, int64_t pos) {
      require_in_vocab(b, c.vocab, shard, pos);
      ++c.unigram[b];
      ++c.first[a];
      if (!c.bigram.empty())
        ++c.bigram[size_t(a) * size_t(c.vocab) + b];
      else
        ++c.sparse[uint64_t(a) << 32 | b];
    });
    c.tokens += shard.info().num_tokens;
  }
  return c;
}

BaselineLoss baseline_loss(const NgramCounts& c, TokenDataset& val, int64_t seq_len) {
  RT_REQUIRE(val.info().vocab_size == c.vocab, "token dataset '", val.info().path,
             "' has vocab_size ", val.info().vocab_size, " but the training split has ", c.vocab,
             "; the baselines need one vocabulary");
  const double v = double(c.vocab), n = double(c.tokens);
  double uni = 0, bi = 0;
  BaselineLoss r;
  for (int64_t s = 0; s < val.info().num_shards; ++s) {
    TokenShard& shard = val.shard(size_t(s));
    const int64_t len = shard.info().num_tokens;
    const int64_t last = seq_len > 0 ? (len - 1) / seq_len * seq_len : len - 1;
    each_pair(shard, 1, last + 1, [&](uint32_t a, uint32_t b, int64_t pos) {
      require_in_vocab(b, c.vocab, shard, pos);
      require_in_vocab(a, c.vocab, shard, pos - 1);
      uni -= std::log((double(c.unigram[b]) + 1) / (n + v));
      bi -= std::log((double(c.pair(a, b)) + 1) / (double(c.first[a]) + v));
    });
    r.targets += last;
  }
  RT_REQUIRE(r.targets > 0, "token dataset '", val.info().path, "' holds no target for windows of ",
             seq_len, " tokens");
  r.unigram = uni / double(r.targets);
  r.bigram = bi / double(r.targets);
  return r;
}

}  // namespace ringtrain::io
