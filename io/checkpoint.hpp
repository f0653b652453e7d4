// Checkpoints, format version 1 (docs/formats.md): one HDF5 file per save, written as
// DIR/ckpt-<step, 9 digits>.h5.tmp, fsync'd, renamed to .h5, directory fsync'd; the newest
// `keep` are kept. A file that fails validation is never chosen for resume, and a save
// never touches an existing good checkpoint until its own file is complete.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace ringtrain::io {

inline constexpr const char* kCheckpointFormat = "ringtrain-checkpoint";
inline constexpr int64_t kCheckpointVersion = 1;

struct CheckpointMeta {
  int64_t step = 0, epoch = 0, samples_seen = 0, world_size = 1;
  int64_t global_batch = 0;  // G of the run that saved (the sequence a resume continues)
  std::string precision, model, ringtrain_version;
  int64_t data_epoch = 0, data_position = 0;  // /data: where the next batch starts
  double loss_scale = 1;
  int64_t growth_tracker = 0;
  std::string optimizer;  // /optimizer attribute "name"
  int64_t optimizer_step = 0;
  int64_t seed = 0;                      // /rng: every stream derives from it
  double input_mean = 0, input_std = 1;  // the input normalisation the model trained with
  // ... per channel, when the data had /mean and /std (attributes input_channel_mean/std)
  std::vector<double> input_channel_mean, input_channel_std;
  int64_t grad_accum = 1;  // micro-batches per step of the run that saved
  // --keep-best/--early-stop: the best evaluation so far (step -1: none yet) and the
  // evaluations since it, so that a resumed run keeps the same best and patience.
  double best_value = 0;
  int64_t best_step = -1, evals_since_best = 0;
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
// Fills each tensor from /buffers/<name> (non-trainable state such as BatchNorm's running
// averages), checking shapes.
void read_checkpoint_buffers(const std::string& path, const std::vector<NamedTensor>& buffers);
// Full check: opens, reads the metadata and every dataset (verifying Fletcher32 checksums),
// and that the file holds each of `expected` (full dataset paths, e.g. "params/fc1.weight")
// as fp32 with its shape.
bool validate_checkpoint(const std::string& path, std::string* why,
                         const std::vector<NamedTensor>& expected = {});

class CheckpointStore {
 public:
  CheckpointStore(std::string dir, int keep);  // input error when the dir cannot be made
  const std::string& dir() const { return dir_; }
  std::string path_for(int64_t step) const;
  // Writes DIR/ckpt-<step>.h5 atomically and prunes to `keep`; returns the file's bytes.
  // Collective over `comm`: every rank calls it with the same meta and replicated tensors;
  // all open the file with parallel HDF5 (MPI-IO, collective metadata and transfers) and
  // each writes its share of whole chunks of every dataset, so replicated state is written
  // once, by all ranks together. `per_rank` holds this rank's row of datasets of shape
  // [W, ...] ("rng/streams" -> /rng/streams), each rank writing its own row. `buffers`
  // (replicated, like params) go to /buffers/<name>. With MPI_COMM_NULL the calling
  // process writes alone (serial HDF5).
  uint64_t save(MPI_Comm comm, const CheckpointMeta& meta, const std::vector<NamedTensor>& params,
                const std::vector<OptimizerState>& optimizer,
                const std::vector<NamedTensor>& per_rank = {},
                const std::vector<NamedTensor>& buffers = {});
  std::vector<std::string> list() const;  // checkpoint files, oldest step first
  // The newest file that validates (and holds `expected`, full dataset paths); the newer
  // ones skipped are listed as (file, what is wrong) in *skipped. same_run, if given, sees
  // each intact file's metadata first and throws for a checkpoint of another run, which
  // is an error rather than a file to skip.
  std::optional<std::string> latest_valid(
      std::vector<std::pair<std::string, std::string>>* skipped,
      const std::vector<NamedTensor>& expected = {},
      const std::function<void(const std::string&, const CheckpointMeta&)>& same_run = {}) const;

 private:
  void prune(const std::string& keep_this);
  std::string dir_;
  int keep_;
};

}  // namespace ringtrain::io
