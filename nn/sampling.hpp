// Drawing the next token from a language model's logits, as `ringtrain sample` does:
// temperature scaling, top-k truncation, then one draw from the renormalised softmax with
// the caller's seeded stream (the same seed gives the same text).
#pragma once

#include <cstdint>

#include "core/rng.hpp"

namespace ringtrain {

// The sampling options, checked once (input errors naming the option and value): temperature
// finite and > 0; top_k from 1 to vocab (0: the whole vocabulary).
void check_sampling_options(double temperature, int64_t top_k, int64_t vocab);

// A token in [0, vocab) drawn from softmax(logits / temperature) restricted to the top_k
// largest logits (ties broken by the lower index; top_k 0: all). top_k 1 is greedy.
int32_t sample_token(const float* logits, int64_t vocab, double temperature, int64_t top_k,
                     Rng& rng);

}  // namespace ringtrain
