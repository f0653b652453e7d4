// Epoch permutations, per-rank batch slices and the prefetch thread (see loader.hpp).
#include "io/loader.hpp"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "core/rng.hpp"

namespace ringtrain::io {

std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  Rng rng(mix_seed(seed ^ 0x5eed0fda7aull, uint64_t(epoch)));
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[size_t(i)], p[rng.below(uint64_t(i) + 1)]);
  return p;
}

Augment parse_augment(const std::string& spec) {
  Augment a;
  if (spec.empty()) return a;
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t end = std::min(spec.find(',', pos), spec.size());
    const std::string part = spec.substr(pos, end - pos);
    long long pad = 0;
    int used = 0;
    if (part == "flip" && !a.flip) {
      a.flip = true;
    } else if (a.pad == 0 && std::sscanf(part.c_str(), "crop:%lld%n", &pad, &used) == 1 &&
               used == int(part.size()) && pad > 0 && pad <= 1024) {
      a.pad = pad;
    } else {
      throw_input(cat("--augment '", spec, "': '", part,
                      "' is not valid; expected crop:PAD (PAD from 1 to 1024 pixels), flip, or "
                      "both, e.g. crop:4,flip"));
    }
    pos = end + 1;
  }
  return a;
}

void augment_samples(const Augment& aug, uint64_t seed, int64_t epoch, const int64_t* idx,
                     int64_t n, const Shape& ss, const Normalization& norm, float* x) {
  const int64_t c = ss[0], h = ss[1], w = ss[2], per = c * h * w, p = aug.pad;
  std::vector<float> src(static_cast<size_t>(per));
  const uint64_t epoch_seed = mix_seed(mix_seed(seed, hash_name("augment")), uint64_t(epoch));
  for (int64_t i = 0; i < n; ++i) {
    Rng rng(mix_seed(epoch_seed, uint64_t(idx[i])));
    // The crop's offset into the padded image, then the flip: drawn in this order always.
    const int64_t dy = p ? int64_t(rng.below(uint64_t(2 * p + 1))) - p : 0;
    const int64_t dx = p ? int64_t(rng.below(uint64_t(2 * p + 1))) - p : 0;
    const bool flip = aug.flip && rng.below(2) == 1;
    if (dy == 0 && dx == 0 && !flip) continue;
    float* dst = x + i * per;
    std::copy(dst, dst + per, src.begin());
    for (int64_t ch = 0; ch < c; ++ch) {
      const size_t k = norm.mean.size() > 1 ? size_t(ch) : 0;
      const float zero = float(-norm.mean[k] / norm.std[k]);  // a raw 0, normalised
      for (int64_t r = 0; r < h; ++r) {
        const int64_t sr = r + dy;
        for (int64_t col = 0; col < w; ++col) {
          const int64_t sc = (flip ? w - 1 - col : col) + dx;
          dst[(ch * h + r) * w + col] =
              sr >= 0 && sr < h && sc >= 0 && sc < w ? src[size_t((ch * h + sr) * w + sc)] : zero;
        }
      }
    }
  }
}

Loader::Loader(Dataset& data, uint64_t seed, int64_t global_batch, int rank, int world,
               const Normalization& norm, int prefetch, Augment augment, bool targets)
    : images_(&data),
      seed_(seed),
      global_batch_(global_batch),
      rank_(rank),
      norm_(norm),
      prefetch_(prefetch),
      augment_(augment),
      targets_(targets) {
  RT_CHECK(!targets || data.info().has_targets, "a target loader on '", data.info().path,
           "', which has no /targets");
  RT_REQUIRE(!augment.any() || !targets || data.info().target_shape.size() < 2,
             "--augment moves the pixels of the images but not those of dense targets; dataset '",
             data.info().path, "' has targets of shape ", shape_str(data.info().target_shape),
             ", so train without --augment");
  RT_REQUIRE(!augment.any() || data.info().sample_shape.size() == 3,
             "--augment needs image "
             "samples [C, H, W]; dataset '",
             data.info().path, "' has samples of shape ", shape_str(data.info().sample_shape));
  init(data.info().num_samples, data.info().path, world);
}

Loader::Loader(TokenDataset& data, uint64_t seed, int64_t global_batch, int rank, int world,
               int prefetch)
    : tokens_(&data), seed_(seed), global_batch_(global_batch), rank_(rank), prefetch_(prefetch) {
  RT_CHECK(data.seq_len() > 0, "a token loader before set_seq_len");
  RT_REQUIRE(global_batch <= data.num_windows(), "global batch size ", global_batch,
             " is larger than token dataset '", data.info().path, "' (", data.num_windows(),
             " windows of ", data.seq_len(), " tokens)");
  init(data.num_windows(), data.info().path, world);
}

void Loader::init(int64_t num_samples, const std::string& path, int world) {
  num_samples_ = num_samples;
  path_ = path;
  RT_REQUIRE(global_batch_ > 0, "the global batch size must be positive, got ", global_batch_);
  RT_REQUIRE(global_batch_ % world == 0, "global batch size ", global_batch_,
             " does not divide by ", world, " ranks; use a multiple of ", world,
             " (or set --batch-size per rank)");
  RT_REQUIRE(global_batch_ <= num_samples, "global batch size ", global_batch_,
             " is larger than dataset '", path, "' (", num_samples, " samples)");
  RT_REQUIRE(prefetch_ >= 0, "--prefetch ", prefetch_, " is negative");
  local_batch_ = global_batch_ / world;
  slots_.resize(size_t(prefetch_) + 1);
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Loader::seek(int64_t epoch, int64_t position) {
  RT_CHECK(!started_, "seek after the loader started");
  RT_REQUIRE(epoch >= 0 && position >= 0 && position <= num_samples_, "data position (epoch ",
             epoch, ", sample ", position, ") does not fit dataset '", path_, "' of ", num_samples_,
             " samples");
  epoch_ = next_epoch_ = epoch;
  position_ = next_position_ = position;
}

void Loader::advance(int64_t& epoch, int64_t& position) const {
  if (position + global_batch_ > num_samples_) {  // drop the partial last batch
    ++epoch;
    position = 0;
  }
}

void Loader::fill(Slot& slot, int64_t epoch, int64_t position) {
  maybe_inject_fault("read");
  if (perm_epoch_ != epoch) {
    perm_ = epoch_permutation(seed_, epoch, num_samples_);
    perm_epoch_ = epoch;
  }
  slot.batch.epoch = epoch;
  slot.batch.position = position;
  const int64_t* idx = perm_.data() + position + int64_t(rank_) * local_batch_;
  // Host memory whatever DeviceScope the caller is in (the Trainer uploads it for a GPU).
  if (tokens_) {
    const int64_t t = tokens_->seq_len();
    slot.batch.kind = DataKind::tokens;
    slot.batch.x = slot.x.ensure({local_batch_, t}, DType::i32, Device{});
    slot.batch.y = slot.y.ensure({local_batch_, t}, DType::i32, Device{});
    tokens_->read_windows(idx, local_batch_, slot.batch.x.as<int32_t>(),
                          slot.batch.y.as<int32_t>());
    return;
  }
  const Shape& ss = images_->info().sample_shape;
  Shape xs = {local_batch_};
  xs.insert(xs.end(), ss.begin(), ss.end());
  slot.batch.kind = DataKind::images;
  slot.batch.x = slot.x.ensure(xs, DType::f32, Device{});
  if (targets_) {
    Shape ys = {local_batch_};
    const auto& info = images_->info();
    ys.insert(ys.end(), info.target_shape.begin(), info.target_shape.end());
    slot.batch.y = slot.y.ensure(ys, info.target_dtype, Device{});
    images_->read(idx, local_batch_, slot.batch.x.as<float>(), nullptr, norm_);
    images_->read_targets(idx, local_batch_, slot.batch.y.data);
  } else {
    slot.batch.y = slot.y.ensure({local_batch_}, DType::i32, Device{});
    images_->read(idx, local_batch_, slot.batch.x.as<float>(), slot.batch.y.as<int32_t>(), norm_);
  }
  if (augment_.any())
    augment_samples(augment_, seed_, epoch, idx, local_batch_, ss, norm_, slot.batch.x.as<float>());
}

void Loader::produce() {
  size_t tail = head_;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // A slot is free when it is neither ready nor held by the consumer.
      const size_t held = (head_ + slots_.size() - 1) % slots_.size();
      cv_.wait(lock, [&] { return stop_ || (!slots_[tail].ready && !(holding_ && tail == held)); });
      if (stop_) return;
    }
    Slot& slot = slots_[tail];
    advance(next_epoch_, next_position_);
    try {
      fill(slot, next_epoch_, next_position_);
    } catch (...) {
      slot.error = std::current_exception();
    }
    next_position_ += global_batch_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      slot.ready = true;
    }
    cv_.notify_all();
    if (slot.error) return;
    tail = (tail + 1) % slots_.size();
  }
}

const Batch& Loader::next() {
  started_ = true;
  if (prefetch_ == 0) {  // synchronous: read now into the one slot
    advance(next_epoch_, next_position_);
    fill(slots_[0], next_epoch_, next_position_);
    next_position_ += global_batch_;
    epoch_ = next_epoch_;
    position_ = next_position_;
    return slots_[0].batch;
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { produce(); });
  Slot* slot;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (holding_) {  // the previous batch is done with: its slot may be refilled
      slots_[(head_ + slots_.size() - 1) % slots_.size()].ready = false;
      holding_ = false;
      cv_.notify_all();
    }
    slot = &slots_[head_];
    cv_.wait(lock, [&] { return slot->ready; });
    head_ = (head_ + 1) % slots_.size();
    holding_ = true;
  }
  cv_.notify_all();
  if (slot->error) std::rethrow_exception(slot->error);
  epoch_ = slot->batch.epoch;
  position_ = slot->batch.position + global_batch_;
  return slot->batch;
}

}  // namespace ringtrain::io
