// The model file's loss block and its application to a batch (see loss.hpp).
#include "nn/loss.hpp"

#include <cstdlib>

#include "core/error.hpp"
#include "nn/model_file.hpp"
#include "ringtrain/model.pb.h"

namespace ringtrain {

const char* loss_kind_name(LossKind kind) {
  switch (kind) {
    case LossKind::softmax_cross_entropy:
      return "softmax_cross_entropy";
    case LossKind::mse:
      return "mse";
    case LossKind::l1:
      return "l1";
    case LossKind::huber:
      return "huber";
    case LossKind::bce_logits:
      return "binary_cross_entropy_with_logits";
    case LossKind::pixel_cross_entropy:
      return "pixel_cross_entropy";
  }
  return "?";
}

const char* target_kind_name(TargetKind kind) {
  switch (kind) {
    case TargetKind::labels:
      return "integer /labels [N]";
    case TargetKind::float_targets:
      return "float32 /targets";
    case TargetKind::int_targets:
      return "integer /targets";
  }
  return "?";
}

namespace {

TargetKind target_of(LossKind kind) {
  switch (kind) {
    case LossKind::softmax_cross_entropy:
      return TargetKind::labels;
    case LossKind::pixel_cross_entropy:
      return TargetKind::int_targets;
    default:
      return TargetKind::float_targets;
  }
}

// The metrics a loss kind supports (top<K> stands for top1, top2, ...).
std::vector<std::string> metrics_of(LossKind kind) {
  switch (kind) {
    case LossKind::softmax_cross_entropy:
      return {"accuracy", "top<K>"};
    case LossKind::bce_logits:
      return {"accuracy", "f1"};
    case LossKind::pixel_cross_entropy:
      return {"accuracy", "mean_iou"};
    default:
      return {"mae", "rmse", "r2"};
  }
}

bool is_top_k(const std::string& m) {
  if (m.size() < 4 || m.compare(0, 3, "top") != 0) return false;
  for (size_t i = 3; i < m.size(); ++i)
    if (m[i] < '0' || m[i] > '9') return false;
  return std::atoll(m.c_str() + 3) >= 1 && m.size() <= 9;
}

// A LossTerm or Loss message: both have the same oneof `kind`.
template <class M>
bool read_kind(const M& m, LossTerm& t, const ModelFile& file) {
  using pb::Loss;
  if (m.has_softmax_cross_entropy()) {
    t.kind = LossKind::softmax_cross_entropy;
    t.label_smoothing = m.softmax_cross_entropy().label_smoothing();
    RT_REQUIRE(t.label_smoothing >= 0.f && t.label_smoothing < 1.f,
               file.where(m.softmax_cross_entropy(), "label_smoothing"), ": label_smoothing ",
               t.label_smoothing, " is outside [0, 1)");
  } else if (m.has_mse()) {
    t.kind = LossKind::mse;
  } else if (m.has_l1()) {
    t.kind = LossKind::l1;
  } else if (m.has_huber()) {
    t.kind = LossKind::huber;
    if (m.huber().has_delta()) t.delta = m.huber().delta();
    RT_REQUIRE(t.delta > 0.f, file.where(m.huber(), "delta"), ": huber delta ", t.delta,
               " must be > 0");
  } else if (m.has_binary_cross_entropy_with_logits()) {
    t.kind = LossKind::bce_logits;
    const auto& b = m.binary_cross_entropy_with_logits();
    t.pos_weight.assign(b.pos_weight().begin(), b.pos_weight().end());
    for (int i = 0; i < b.pos_weight_size(); ++i)
      RT_REQUIRE(b.pos_weight(i) > 0.f, file.where(b, "pos_weight", i), ": pos_weight ",
                 b.pos_weight(i), " must be > 0");
  } else if (m.has_pixel_cross_entropy()) {
    t.kind = LossKind::pixel_cross_entropy;
    if (m.pixel_cross_entropy().has_ignore_index())
      t.ignore_index = m.pixel_cross_entropy().ignore_index();
  } else {
    return false;
  }
  return true;
}

}  // namespace

std::string LossSpec::name() const {
  if (terms.size() == 1 && terms[0].weight == 1) return loss_kind_name(terms[0].kind);
  std::string s;
  for (const auto& t : terms) {
    if (!s.empty()) s += "+";
    if (t.weight != 1) s += cat(t.weight, "*");
    s += loss_kind_name(t.kind);
  }
  return s;
}

TargetKind LossSpec::target_kind() const { return target_of(terms.at(0).kind); }

bool LossSpec::reports_accuracy() const {
  return terms.size() == 1 && terms[0].kind == LossKind::softmax_cross_entropy;
}

LossSpec loss_spec_of(const ModelFile& file) {
  LossSpec spec;
  const pb::Model& m = file.def();
  if (!m.has_loss()) {
    spec.terms.emplace_back();
    return spec;
  }
  const pb::Loss& l = m.loss();
  LossTerm single;
  if (read_kind(l, single, file)) {
    RT_REQUIRE(l.term_size() == 0, file.where(l, "term"),
               ": a loss block names one loss or a list of `term`s, not both");
    spec.terms.push_back(single);
  }
  for (int i = 0; i < l.term_size(); ++i) {
    const pb::LossTerm& pt = l.term(i);
    LossTerm t;
    RT_REQUIRE(read_kind(pt, t, file), file.where(pt),
               ": the loss term names no loss; expected "
               "one of softmax_cross_entropy, mse, l1, huber, binary_cross_entropy_with_logits, "
               "pixel_cross_entropy");
    if (pt.has_weight()) t.weight = pt.weight();
    RT_REQUIRE(t.weight > 0, file.where(pt, "weight"), ": loss weight ", t.weight, " must be > 0");
    if (!spec.terms.empty())
      RT_REQUIRE(target_of(t.kind) == spec.target_kind(), file.where(pt), ": the loss term '",
                 loss_kind_name(t.kind), "' reads ", target_kind_name(target_of(t.kind)), " but '",
                 loss_kind_name(spec.terms[0].kind), "' reads ",
                 target_kind_name(spec.target_kind()),
                 "; the terms of one loss must read the same target");
    spec.terms.push_back(t);
  }
  for (const auto& t : spec.terms)
    RT_REQUIRE(spec.terms.size() == 1 || t.kind != LossKind::softmax_cross_entropy, file.where(l),
               ": softmax_cross_entropy cannot be a term of a weighted sum");
  RT_REQUIRE(!spec.terms.empty(), file.where(l),
             ": the loss block names no loss; expected one of "
             "softmax_cross_entropy, mse, l1, huber, binary_cross_entropy_with_logits, "
             "pixel_cross_entropy (or `term`s of them)");
  for (int i = 0; i < l.metric_size(); ++i) {
    const std::string& name = l.metric(i);
    bool ok = false;
    std::string supported;
    for (const auto& t : spec.terms)
      for (const std::string& s : metrics_of(t.kind)) {
        ok = ok || s == name || (s == "top<K>" && is_top_k(name));
        if (supported.find(s) == std::string::npos)
          supported += (supported.empty() ? "" : ", ") + s;
      }
    RT_REQUIRE(ok, file.where(l, "metric", i), ": metric '", name, "' is not one the loss '",
               spec.name(), "' supports; expected one of ", supported);
    spec.metrics.push_back(name);
  }
  return spec;
}

void check_loss_output(const LossSpec& spec, const Shape& out, const Shape& target, int64_t classes,
                       const std::string& where) {
  if (spec.target_kind() == TargetKind::labels || target.empty()) return;
  const bool pixel = spec.target_kind() == TargetKind::int_targets;
  Shape expect = target;
  if (pixel) expect.insert(expect.begin(), classes);
  RT_REQUIRE(out == expect, where, "the model's output has shape ", shape_str(out),
             " per sample but the loss '", spec.name(), "' needs ", shape_str(expect),
             " for targets of shape ", shape_str(target),
             pixel ? cat(" in ", classes, " classes") : std::string());
  for (const auto& t : spec.terms)
    RT_REQUIRE(t.pos_weight.empty() || int64_t(t.pos_weight.size()) == out.back(), where,
               "pos_weight has ", t.pos_weight.size(), " values but the output has ", out.back(),
               " labels (shape ", shape_str(out), "); give one per label");
}

kernels::XentResult LossFunction::apply(kernels::Backend& backend, const Tensor& out,
                                        const Tensor& y, float grad_scale, const Tensor* dout,
                                        float label_smoothing) {
  kernels::XentResult res;
  const int64_t n = out.dim(0);
  pos_weight_.resize(spec_.terms.size());
  for (size_t i = 0; i < spec_.terms.size(); ++i) {
    const LossTerm& t = spec_.terms[i];
    const float g = float(double(grad_scale) * t.weight);
    const bool acc = i > 0;  // the later terms add their gradient to the first's
    switch (t.kind) {
      case LossKind::softmax_cross_entropy: {
        RT_CHECK(!acc, "softmax_cross_entropy must be a loss's first term");
        const auto r = backend.softmax_xent(
            out, y, g, dout, t.label_smoothing ? t.label_smoothing : label_smoothing);
        res.loss_sum += t.weight * r.loss_sum;
        res.correct += r.correct;
        break;
      }
      case LossKind::pixel_cross_entropy: {
        const auto r = backend.pixel_xent(out, y, t.ignore_index, g, dout, acc);
        res.loss_sum += t.weight * (r.counted ? r.loss_sum / double(r.counted) : 0.0) * double(n);
        break;
      }
      default: {
        const Tensor* pw = nullptr;
        if (!t.pos_weight.empty()) {
          OwnedTensor& o = pos_weight_[i];
          if (o.view.numel() != int64_t(t.pos_weight.size()) || !(o.view.device == out.device)) {
            o.ensure({int64_t(t.pos_weight.size())}, DType::f32, out.device);
            copy_bytes(o.view.data, out.device, t.pos_weight.data(), Device{},
                       t.pos_weight.size() * 4);
          }
          pw = &o.view;
        }
        const kernels::PointwiseLoss kind = t.kind == LossKind::mse  ? kernels::PointwiseLoss::mse
                                            : t.kind == LossKind::l1 ? kernels::PointwiseLoss::l1
                                            : t.kind == LossKind::huber
                                                ? kernels::PointwiseLoss::huber
                                                : kernels::PointwiseLoss::bce_logits;
        const double sum = backend.pointwise_loss(kind, out, y, t.delta, pw, g, dout, acc);
        res.loss_sum += t.weight * sum / double(out.numel()) * double(n);
        break;
      }
    }
  }
  return res;
}

}  // namespace ringtrain
