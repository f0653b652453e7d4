// Deterministic random numbers that do not depend on the platform's <random> distributions:
// splitmix64 for seeding and hashing, xoshiro256** for streams. Parameter init, the epoch
// permutation and (later) dropout all derive their streams from the run's --seed.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace ringtrain {

uint64_t splitmix64(uint64_t& state);
// Combines a seed with a stream id (a step, an epoch, a hashed name) into a new seed.
uint64_t mix_seed(uint64_t seed, uint64_t stream);
uint64_t hash_name(std::string_view s);  // FNV-1a, stable across builds

class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  float uniform();             // [0, 1) with 24 random bits
  uint64_t below(uint64_t n);  // uniform in [0, n), unbiased
  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<uint64_t, 4> s_;
};

}  // namespace ringtrain
