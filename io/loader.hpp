// Loader: the data order of design.md. Epoch e visits perm(seed, e) of all N samples;
// global batch k is positions [k*G, (k+1)*G); rank r of W takes the r-th of W equal
// contiguous slices. So the samples a step trains on do not depend on W. A sample is an
// image with its label, or for a token dataset a window of T + 1 tokens (io/tokens.hpp):
// the same rule over window indices.
// With prefetch > 0 a background thread reads that many batches ahead into reusable
// buffers; the consumer-side position (epoch, next permutation position) is what a
// checkpoint stores. Augmentation (--augment) runs in the same thread, after the read, with
// one random stream per (seed, epoch, dataset index): a sample is augmented the same way
// whichever rank reads it, on any rank count and after a resume.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.hpp"
#include "io/dataset.hpp"
#include "io/tokens.hpp"

namespace ringtrain::io {

// Fisher-Yates over [0, n) with a stream derived from (seed, epoch).
std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t n);

// --augment crop:PAD,flip: a random crop of the sample after zero padding by PAD on every
// side (the size stays), and a horizontal flip with probability 1/2.
struct Augment {
  int64_t pad = 0;
  bool flip = false;
  bool any() const { return pad > 0 || flip; }
};
// Input error naming --augment for anything but "crop:PAD", "flip" or both, comma-separated.
Augment parse_augment(const std::string& spec);
// Augments the samples x [n, C, H, W] (normalised) in place; idx are their dataset indices.
// A padded pixel is what a raw 0 normalises to in its channel.
void augment_samples(const Augment& aug, uint64_t seed, int64_t epoch, const int64_t* idx,
                     int64_t n, const Shape& sample_shape, const Normalization& norm, float* x);

struct Batch {
  DataKind kind = DataKind::images;
  Tensor x;  // images: [B, sample...] float32, normalised; tokens: [B, T] int32 inputs
  // images: [B] int32 labels, or with targets [B, target...] float32 or int32 (/targets);
  // tokens: [B, T] int32 targets (inputs shifted by 1)
  Tensor y;
  int64_t epoch = 0, position = 0;  // where this batch starts in the epoch permutation
};

class Loader {
 public:
  // Input error when the global batch does not divide by `world` or exceeds the dataset.
  // With `targets` the batches carry the dataset's /targets instead of its /labels.
  Loader(Dataset& data, uint64_t seed, int64_t global_batch, int rank, int world,
         const Normalization& norm, int prefetch = 0, Augment augment = {}, bool targets = false);
  // Windows of data.seq_len() tokens (set_seq_len() first); the same rules.
  Loader(TokenDataset& data, uint64_t seed, int64_t global_batch, int rank, int world,
         int prefetch = 0);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t steps_per_epoch() const { return num_samples_ / global_batch_; }
  int64_t num_samples() const { return num_samples_; }  // images, or windows
  int64_t local_batch() const { return local_batch_; }
  // Where the next batch handed out starts (a checkpoint records this).
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }
  // Continue from a position a checkpoint recorded (input error when it does not fit).
  // Only before the first next().
  void seek(int64_t epoch, int64_t position);
  // This rank's slice of the next global batch; a partial last batch of an epoch is
  // dropped and the next epoch begins. Valid until the next call.
  const Batch& next();

 private:
  struct Slot {
    OwnedTensor x, y;
    Batch batch;
    bool ready = false;
    std::exception_ptr error;
  };
  void advance(int64_t& epoch, int64_t& position) const;  // to the start of a full batch
  void fill(Slot& slot, int64_t epoch, int64_t position);
  void produce();  // the prefetch thread
  // Checks shared by both constructors, against N samples of the dataset at `path`.
  void init(int64_t num_samples, const std::string& path, int world);

  Dataset* images_ = nullptr;  // one of these two is the data
  TokenDataset* tokens_ = nullptr;
  int64_t num_samples_ = 0;
  std::string path_;
  uint64_t seed_;
  int64_t global_batch_, local_batch_;
  int rank_;
  Normalization norm_;
  int prefetch_;
  Augment augment_;
  bool targets_ = false;
  int64_t epoch_ = 0, position_ = 0;            // consumer side
  int64_t next_epoch_ = 0, next_position_ = 0;  // producer side
  int64_t perm_epoch_ = -1;
  std::vector<int64_t> perm_;
  std::vector<Slot> slots_;
  size_t head_ = 0;       // the slot next() hands out next
  bool holding_ = false;  // the consumer holds the slot before head_
  bool started_ = false;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace ringtrain::io
