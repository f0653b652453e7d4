// Checkpoints, format version 1 (docs/formats.md): one HDF5 file per save, written as
// DIR/ckpt-<step, 9 digits>.h5.tmp, fsync'd, renamed to .h5, directory fsync'd; the newest
// `keep` are kept. A file that fails validation (checksums, missing datasets, non-finite
// or impossible values) is never chosen for resume, and a save never touches an existing
// good checkpoint until its own file is complete. The job that writes a directory holds
// DIR/.lock (flock), so two jobs never share one.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.hpp"

namespace ringtrain::io {

inline constexpr const char* kCheckpointFormat = "ringtrain-checkpoint";
inline constexpr int64_t kCheckpointVersion = 1;

// The values of a checkpoint's attributes; io/checkpoint_schema.hpp maps each to its name,
// type and rule. A default here is what an optional attribute that is absent reads as.
struct CheckpointMeta {
  int64_t step = 0, epoch = 0, samples_seen = 0, world_size = 1;
  int64_t global_batch = 0;  // G of the run that saved (the sequence a resume continues)
  std::string precision, model, ringtrain_version;
  // The plugin libraries the model's ops come from, one "OP=LIBRARY" line per op ("" none).
  std::string plugins;
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
  std::string best_metric;  // only DIR/best.h5 has it (val_loss or val_accuracy)
  // Language models: the training data's tokenizer ("bytes", "sentencepiece"), the SHA-256 of
  // its model file and the absolute path of a training shard that holds the model's bytes
  // (empty for bytes and for image models).
  std::string tokenizer, tokenizer_sha256, tokenizer_data;
};

struct NamedTensor {
  NamedTensor() = default;
  NamedTensor(std::string n, Tensor t, Shape full = {}, int64_t offset = 0)
      : name(std::move(n)), tensor(t), full_shape(std::move(full)), part_offset(offset) {}
  std::string name;  // "<layer>.<param>"
  Tensor tensor;     // fp32: the whole tensor, or with full_shape this rank's part of it
  // A sharded tensor (ZeRO-1): `tensor` holds the flat elements [part_offset, part_offset +
  // tensor.numel()) of the row-major tensor of shape full_shape, which is what the file
  // stores. Empty: `tensor` is whole.
  Shape full_shape;
  int64_t part_offset = 0;
  // A tensor-parallel part (split_axis >= 0): `tensor` holds the ranges split_ranges along
  // split_axis of the full-shape tensor (all of its other axes), concatenated; part_offset
  // unused. `writes` false: this rank reads its part but another rank holding the same part
  // writes it (data-parallel replicas of a part).
  int split_axis = -1;
  std::vector<std::pair<int64_t, int64_t>> split_ranges;
  bool writes = true;
  const Shape& logical_shape() const { return full_shape.empty() ? tensor.shape : full_shape; }
};

struct OptimizerState {
  std::string state;  // "momentum", "exp_avg", ...
  std::vector<NamedTensor> per_param;
};

// Reads the root/group attributes; input error if `path` is not a ringtrain checkpoint of a
// version this build reads, or if a value is one no save writes (impossible_meta).
CheckpointMeta read_checkpoint_meta(const std::string& path);
// Why metadata cannot be that of a real save (a value that breaks its rule in the
// checkpoint schema: a negative step, a non-finite loss scale, ...), or "" when it can.
std::string impossible_meta(const CheckpointMeta& m);
// Why the values of a float tensor stored as `name` (e.g. "params/fc1.weight",
// "optimizer/fc1.weight/exp_avg_sq") are impossible: the first non-finite value, or a
// negative one where only non-negative ones exist (exp_avg_sq, running_var); "" if fine.
std::string impossible_values(const std::string& name, const float* v, int64_t n);
// Throws a runtime error (exit 2) naming the first tensor that holds a non-finite value,
// and where: a save never writes a checkpoint that resume would then reject.
void require_finite_for_save(const CheckpointMeta& meta, const std::vector<NamedTensor>& params,
                             const std::vector<OptimizerState>& optimizer,
                             const std::vector<NamedTensor>& buffers = {});
// Fill each tensor from /params/<name> (or /optimizer/<name>/<state>), checking shapes and
// values (input error naming the file and tensor when impossible_values finds a problem).
// A sharded NamedTensor reads only its part.
void read_checkpoint_params(const std::string& path, const std::vector<NamedTensor>& params);
void read_checkpoint_optimizer(const std::string& path, const std::vector<OptimizerState>& states);
// Fills each tensor from /buffers/<name> (non-trainable state such as BatchNorm's running
// averages), checking shapes.
void read_checkpoint_buffers(const std::string& path, const std::vector<NamedTensor>& buffers);
// Full check: opens, reads the metadata and every dataset (verifying Fletcher32 checksums
// and that every float value is possible), and that the file holds each of `expected` (full dataset
// paths, e.g. "params/fc1.weight") as fp32 with its shape.
bool validate_checkpoint(const std::string& path, std::string* why,
                         const std::vector<NamedTensor>& expected = {});

// An upper bound of the bytes of the checkpoint file save() writes for these arguments on
// `world` ranks, chunks aligned to `block` (io::h5_file_bytes_bound): what a save reserves
// before HDF5 writes anything (checkpoint_writer.cpp).
uint64_t checkpoint_bytes_bound(const CheckpointMeta& meta, const std::vector<NamedTensor>& params,
                                const std::vector<OptimizerState>& optimizer,
                                const std::vector<NamedTensor>& per_rank,
                                const std::vector<NamedTensor>& buffers, int world, uint64_t block);

// One checkpoint file at `path`, written as CheckpointStore::save writes one (collective,
// PATH.tmp then renamed; each rank its share or its hyperslabs of sharded tensors), outside
// any store: no directory lock, nothing pruned. `convert hf` writes its output with it.
uint64_t save_checkpoint_file(MPI_Comm comm, const std::string& path, const CheckpointMeta& meta,
                              const std::vector<NamedTensor>& params,
                              const std::vector<OptimizerState>& optimizer = {},
                              const std::vector<NamedTensor>& buffers = {});

class CheckpointStore {
 public:
  CheckpointStore(std::string dir, int keep);  // input error when the dir cannot be made
  ~CheckpointStore();
  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;
  const std::string& dir() const { return dir_; }
  // Takes DIR/.lock with flock (non-blocking) for the life of this store and writes
  // "host pid" into it; the one process of a job that writes the directory (rank 0) calls
  // it before touching any file there. Input error naming the holder's host and pid when
  // another job holds it. Returns a warning when the file system has no locks (the job
  // runs unprotected), else "".
  std::string lock();
  std::string path_for(int64_t step) const;
  // Writes DIR/ckpt-<step>.h5 atomically and prunes to `keep`; returns the file's bytes.
  // Collective over `comm`: every rank calls it with the same meta and replicated tensors;
  // all open the file with parallel HDF5 (MPI-IO, collective metadata and transfers) and
  // each writes its share of whole chunks of every dataset, so replicated state is written
  // once, by all ranks together. `per_rank` holds this rank's row of datasets of shape
  // [W, ...] ("rng/streams" -> /rng/streams), each rank writing its own row. `buffers`
  // (replicated, like params) go to /buffers/<name>. A sharded tensor (NamedTensor with
  // full_shape) is written by each rank as its hyperslab of the full-shape dataset; the
  // ranks' parts must cover it. With MPI_COMM_NULL the calling process writes alone
  // (serial HDF5).
  uint64_t save(MPI_Comm comm, const CheckpointMeta& meta, const std::vector<NamedTensor>& params,
                const std::vector<OptimizerState>& optimizer,
                const std::vector<NamedTensor>& per_rank = {},
                const std::vector<NamedTensor>& buffers = {});
  // Chunks this process stored directly in its last save (pwritev of the bytes and their
  // Fletcher32 at the chunk's address, see checkpoint_writer.cpp); 0 when every dataset
  // went through HDF5's filter pipeline (RINGTRAIN_CHECKPOINT_DIRECT=0, or a layout HDF5
  // did not allocate as expected).
  int64_t last_direct_chunks() const { return direct_chunks_; }
  std::vector<std::string> list() const;  // checkpoint files, oldest step first
  // Checkpoints renamed aside as damaged (ckpt-<step>.h5.invalid), oldest step first.
  std::vector<std::string> list_invalid() const;
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
  int lock_fd_ = -1;  // DIR/.lock while this store holds it
  int64_t direct_chunks_ = 0;
};

}  // namespace ringtrain::io
