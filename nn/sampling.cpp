// Temperature and top-k sampling of the next token (see sampling.hpp).
#include "nn/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.hpp"

namespace ringtrain {

void check_sampling_options(double temperature, int64_t top_k, int64_t vocab) {
  RT_REQUIRE(std::isfinite(temperature) && temperature > 0, "--temperature ", temperature,
             " is not valid; expected a finite value > 0 (1: the model's distribution, "
             "lower: more conservative)");
  RT_REQUIRE(top_k >= 0 && top_k <= vocab, "--top-k ", top_k, " is not valid; expected 1 to ",
             vocab, " (the vocabulary), or 0 for all");
}

int32_t sample_token(const float* logits, int64_t vocab, double temperature, int64_t top_k,
                     Rng& rng) {
  check_sampling_options(temperature, top_k, vocab);
  const int64_t k = top_k == 0 ? vocab : top_k;
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  // The k largest, in decreasing order (a stable order: ties go to the lower index).
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  // Softmax in double, shifted by the largest logit so that no exp overflows.
  const double top = double(logits[order[0]]);
  std::vector<double> p(static_cast<size_t>(k));
  double sum = 0;
  for (int64_t i = 0; i < k; ++i)
    sum += p[size_t(i)] = std::exp((logits[order[size_t(i)]] - top) / temperature);
  // 53 random bits: a uniform double in [0, sum).
  const double u = double(rng.next() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (int64_t i = 0; i < k; ++i) {
    acc += p[size_t(i)];
    if (u < acc) return order[size_t(i)];
  }
  return order[size_t(k - 1)];  // u within rounding of sum
}

}  // namespace ringtrain
