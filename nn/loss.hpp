// The loss a model trains with and the metrics evaluation reports, as the model file's
// `loss { ... }` block declares them (docs/models.md, "Loss and metrics"): softmax
// cross-entropy on /labels (the default), the elementwise losses on float /targets (mse, l1,
// huber, binary cross-entropy with logits), cross-entropy per position on integer /targets,
// or a weighted sum of terms of one target kind. The loss is computed in fp32 on the output
// node's fp32 values whatever the precision (the precision policy keeps that node in fp32).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain {

class ModelFile;

enum class LossKind { softmax_cross_entropy, mse, l1, huber, bce_logits, pixel_cross_entropy };
// What the loss reads: the data's /labels [N], float /targets, or integer /targets.
enum class TargetKind { labels, float_targets, int_targets };

struct LossTerm {
  LossKind kind = LossKind::softmax_cross_entropy;
  double weight = 1;
  float label_smoothing = 0;      // softmax_cross_entropy
  float delta = 1;                // huber
  std::vector<float> pos_weight;  // bce_logits: one per label, or empty
  int32_t ignore_index = -100;    // pixel_cross_entropy
};

struct LossSpec {
  std::vector<LossTerm> terms;       // one at least
  std::vector<std::string> metrics;  // as the file names them
  // "mse", or a weighted sum "0.5*mse+l1": what the progress line and records call it.
  std::string name() const;
  TargetKind target_kind() const;
  bool is_default() const {
    return terms.size() == 1 && terms[0].kind == LossKind::softmax_cross_entropy;
  }
  // Evaluation reports this loss and its metrics (not only a classifier's loss and accuracy).
  bool own_evaluation() const { return !is_default() || !metrics.empty(); }
  // Whether training reports an accuracy (the fraction of arg-max predictions that are
  // right): softmax cross-entropy only (the others report theirs in evaluation).
  bool reports_accuracy() const;
};

const char* loss_kind_name(LossKind kind);
const char* target_kind_name(TargetKind kind);

// The model file's loss block (softmax cross-entropy when it has none). Input errors
// (FILE:LINE:COLUMN) for terms of different target kinds, a negative weight or delta, an
// unknown metric or one the loss does not support.
LossSpec loss_spec_of(const ModelFile& file);

// Input error naming the loss and both shapes unless an output of `out` per sample fits
// targets of `target` (float losses: equal shapes; per-position cross-entropy:
// [classes, target...] with the data's classes; a pos_weight of the last dimension's length).
// `where` prefixes the message.
void check_loss_output(const LossSpec& spec, const Shape& out, const Shape& target, int64_t classes,
                       const std::string& where);

// Applies a LossSpec to a batch: the summed loss of the terms (each term's mean, weighted) and
// its gradient. Holds the pos_weight tensors on the outputs' device.
class LossFunction {
 public:
  explicit LossFunction(LossSpec spec) : spec_(std::move(spec)) {}
  const LossSpec& spec() const { return spec_; }
  // out: the output node's fp32 values [N, ...]; y: the batch's labels or targets. Returns
  // loss_sum = the loss times N (what the reporters divide by samples) and, for softmax
  // cross-entropy, `correct`: the number of right arg-max predictions.
  // dout, when given, receives dloss/dout * grad_scale. `label_smoothing` applies to a
  // softmax_cross_entropy term that declares none (--label-smoothing).
  kernels::XentResult apply(kernels::Backend& backend, const Tensor& out, const Tensor& y,
                            float grad_scale, const Tensor* dout, float label_smoothing = 0.f);

 private:
  LossSpec spec_;
  std::vector<OwnedTensor> pos_weight_;  // per term, on the outputs' device
};

}  // namespace ringtrain
