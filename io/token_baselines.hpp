// The baselines a language model's validation loss is read against: the cross-entropy of
// unigram and bigram models counted on the training split and evaluated on the validation
// split, with add-one (Laplace) smoothing so that an unseen token or pair costs a finite
// amount: p(b) = (c(b) + 1) / (N + V), p(b | a) = (c(a b) + 1) / (c(a .) + V).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "io/tokens.hpp"

namespace ringtrain::io {

struct NgramCounts {
  int64_t vocab = 0, tokens = 0;
  std::vector<int64_t> unigram;  // [V]
  std::vector<int64_t> first;    // [V]: pairs starting with a (c(a .))
  // Pairs (a, b) within one shard: dense [V * V] for small vocabularies, else a map.
  std::vector<int64_t> bigram;
  std::unordered_map<uint64_t, int64_t> sparse;
  int64_t pair(uint32_t a, uint32_t b) const;
};

// Counts every token and every adjacent pair of every shard of `data`.
NgramCounts count_ngrams(TokenDataset& data);

struct BaselineLoss {
  double unigram = 0, bigram = 0;  // mean nats per target token
  int64_t targets = 0;
};

// The mean cross-entropy of the smoothed unigram and bigram models over the targets a
// model's evaluation of `val` with windows of seq_len predicts: positions 1 .. w T of each
// shard holding w = (L - 1) / T windows (seq_len 0: positions 1 .. L - 1). The previous
// token of a target is the one before it in the stream. Input error when the vocabularies
// differ.
BaselineLoss baseline_loss(const NgramCounts& counts, TokenDataset& val, int64_t seq_len);

}  // namespace ringtrain::io
