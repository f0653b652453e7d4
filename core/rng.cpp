// splitmix64, xoshiro256** (Blackman & Vigna) and Lemire's unbiased bounded integers.
#include "core/rng.hpp"

namespace ringtrain {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t mix_seed(uint64_t seed, uint64_t stream) {
  uint64_t s = seed ^ (stream * 0xd1b54a32d192ed03ull);
  splitmix64(s);
  return splitmix64(s);
}

uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

Rng::Rng(uint64_t seed) {
  for (auto& w : s_) w = splitmix64(seed);
}

uint64_t Rng::next() {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

float Rng::uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }

uint64_t Rng::below(uint64_t n) {
  unsigned __int128 m = (unsigned __int128)next() * n;
  uint64_t low = uint64_t(m);
  if (low < n) {
    const uint64_t threshold = -n % n;
    while (low < threshold) {
      m = (unsigned __int128)next() * n;
      low = uint64_t(m);
    }
  }
  return uint64_t(m >> 64);
}

}  // namespace ringtrain
