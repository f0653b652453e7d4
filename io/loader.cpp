// Epoch permutations and per-rank batch slices (see loader.hpp).
#include "io/loader.hpp"

#include <numeric>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace ringtrain::io {

std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  Rng rng(mix_seed(seed ^ 0x5eed0fda7aull, uint64_t(epoch)));
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[size_t(i)], p[rng.below(uint64_t(i) + 1)]);
  return p;
}

Loader::Loader(Dataset& data, uint64_t seed, int64_t global_batch, int rank, int world, double mean,
               double std)
    : data_(data), seed_(seed), global_batch_(global_batch), rank_(rank), mean_(mean), std_(std) {
  RT_REQUIRE(global_batch > 0, "the global batch size must be positive, got ", global_batch);
  RT_REQUIRE(global_batch % world == 0, "global batch size ", global_batch, " does not divide by ",
             world, " ranks; use a multiple of ", world, " (or set --batch-size per rank)");
  RT_REQUIRE(global_batch <= data.info().num_samples, "global batch size ", global_batch,
             " is larger than dataset '", data.info().path, "' (", data.info().num_samples,
             " samples)");
  local_batch_ = global_batch / world;
}

void Loader::seek(int64_t epoch, int64_t position) {
  RT_REQUIRE(epoch >= 0 && position >= 0 && position <= data_.info().num_samples,
             "data position (epoch ", epoch, ", sample ", position, ") does not fit dataset '",
             data_.info().path, "' of ", data_.info().num_samples, " samples");
  epoch_ = epoch;
  position_ = position;
}

const Batch& Loader::next() {
  const int64_t n = data_.info().num_samples;
  if (position_ + global_batch_ > n) {  // drop the partial last batch
    ++epoch_;
    position_ = 0;
  }
  if (perm_epoch_ != epoch_) {
    perm_ = epoch_permutation(seed_, epoch_, n);
    perm_epoch_ = epoch_;
  }
  Shape xs = {local_batch_};
  xs.insert(xs.end(), data_.info().sample_shape.begin(), data_.info().sample_shape.end());
  batch_.x = x_.ensure(xs, DType::f32);
  batch_.y = y_.ensure({local_batch_}, DType::i32);
  batch_.epoch = epoch_;
  batch_.position = position_;
  const int64_t* idx = perm_.data() + position_ + int64_t(rank_) * local_batch_;
  data_.read(idx, local_batch_, batch_.x.as<float>(), batch_.y.as<int32_t>(), mean_, std_);
  position_ += global_batch_;
  return batch_;
}

}  // namespace ringtrain::io
