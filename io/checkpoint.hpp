// Checkpoints, format version 1 (docs/formats.md): one HDF5 file per save, written as
// DIR/ckpt-<step, 9 digits>.h5.tmp, fsync'd, renamed to .h5, directory fsync'd; the newest
// `keep` are kept. A file that fails validation is never chosen for resume, and a save
// never touches an existing good checkpoint until its own file is complete.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace ringtrain::io {

inline constexpr const char* kCheckpointFormat = "ringtrain-checkpoint";
inline constexpr int64_t kCheckpointVersion = 1;

struct CheckpointMeta {
  int64_t step = 0, epoch = 0, samples_seen = 0, world_size = 1;
  std::string precision, model, ringtrain_version;
  int64_t data_epoch = 0, data_position = 0;  // /data: where the next batch starts
  double loss_scale = 1;
  int64_t growth_tracker = 0;
  std::string optimizer;  // /optimizer attribute "name"
  int64_t optimizer_step = 0;
  int64_t seed = 0;                      // /rng: every stream derives from it
  double input_mean = 0, input_std = 1;  // the input normalisation the model trained with
};

struct NamedTensor {
  std::string name;  // "<layer>.<param>"
  Tensor tensor;     // fp32
};

struct OptimizerState {
  std::string state;  // "momentum", "exp_avg", ...
  std::vector<NamedTensor> per_param;
};

// Reads the root/group attributes; input error if `path` is not a ringtrain checkpoint of a
// version this build reads.
CheckpointMeta read_checkpoint_meta(const std::string& path);
// Fills each tensor from /params/<name> (or /optimizer/<name>/<state>), checking shapes.
void read_checkpoint_params(const std::string& path, const std::vector<NamedTensor>& params);
void read_checkpoint_optimizer(const std::string& path, const std::vector<OptimizerState>& states);
// Full check: opens, reads the metadata and every dataset (verifying Fletcher32 checksums).
bool validate_checkpoint(const std::string& path, std::string* why);

class CheckpointStore {
 public:
  CheckpointStore(std::string dir, int keep);  // input error when the dir cannot be made
  const std::string& dir() const { return dir_; }
  std::string path_for(int64_t step) const;
  // Writes atomically and prunes to `keep`; returns the bytes of the new file.
  uint64_t save(const CheckpointMeta& meta, const std::vector<NamedTensor>& params,
                const std::vector<OptimizerState>& optimizer);
  std::vector<std::string> list() const;  // checkpoint files, oldest step first
  // The newest file that validates; the ones skipped are described in *skipped.
  std::optional<std::string> latest_valid(std::vector<std::string>* skipped) const;

 private:
  void prune();
  std::string dir_;
  int keep_;
};

}  // namespace ringtrain::io
