// `convert npy`: images and labels from NumPy .npy/.npz files (see convert_source.hpp).
// Every rank reads the arrays whole (a .npz member can only be read from its start) and
// hands out its slice, transposed from NHWC when asked.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "io/convert_source.hpp"
#include "io/npy.hpp"

namespace ringtrain::io {
namespace {

int64_t label_at(const NpyArray& a, int64_t i) {
  const uint8_t* p = a.data.data() + size_t(i) * npy_type_size(a.header.type);
  auto get = [&](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (a.header.type) {
    case NpyType::u1:
      return get(uint8_t{});
    case NpyType::i1:
      return get(int8_t{});
    case NpyType::u2:
      return get(uint16_t{});
    case NpyType::i2:
      return get(int16_t{});
    case NpyType::u4:
      return get(uint32_t{});
    case NpyType::i4:
      return get(int32_t{});
    case NpyType::u8: {
      const uint64_t v = get(uint64_t{});
      return v > uint64_t(INT64_MAX) ? -1 : int64_t(v);
    }
    case NpyType::i8:
      return get(int64_t{});
    default:
      return -1;
  }
}

class NpySource : public ConvertSource {
 public:
  NpySource(const std::string& images_spec, const std::string& labels_spec,
            const std::string& layout, const std::string& targets_spec)
      : layout_(layout) {
    RT_REQUIRE(layout == "nchw" || layout == "nhwc", "--layout '", layout,
               "' is not known; expected nchw or nhwc");
    images_ = read_npy(images_spec);
    const NpyHeader& h = images_.header;
    RT_REQUIRE(h.type == NpyType::u1 || h.type == NpyType::f4, "--images '", images_.what,
               "' holds ", npy_type_name(h.type),
               "; expected uint8 or float32 images (convert "
               "with x.astype(np.float32) or np.uint8)");
    const Shape& s = h.shape;
    RT_REQUIRE(s.size() >= 2 && s.size() <= 4, "--images '", images_.what, "' has shape ",
               shape_str(s),
               "; expected [N, C, H, W], [N, H, W, C] (--layout nhwc), [N, H, W] "
               "or [N, D]");
    RT_REQUIRE(s[0] > 0, "--images '", images_.what, "' holds no images (shape ", shape_str(s),
               ")");
    for (int64_t d : s)
      RT_REQUIRE(d > 0, "--images '", images_.what, "' has an empty dimension: ", shape_str(s));
    info_.num_samples = s[0];
    info_.dtype = h.type == NpyType::u1 ? DType::u8 : DType::f32;
    if (s.size() == 4)
      info_.sample_shape = layout == "nhwc" ? Shape{s[3], s[1], s[2]} : Shape{s[1], s[2], s[3]};
    else if (s.size() == 3)
      info_.sample_shape = {1, s[1], s[2]};
    else
      info_.sample_shape = {s[1]};
    RT_REQUIRE(layout == "nchw" || s.size() == 4, "--layout nhwc needs 4-d images [N, H, W, C]; '",
               images_.what, "' has shape ", shape_str(s));
    info_.has_labels = !labels_spec.empty();
    if (!targets_spec.empty()) open_targets(targets_spec, s[0]);
    if (!info_.has_labels) return;
    NpyArray lb = read_npy(labels_spec);
    const NpyType lt = lb.header.type;
    RT_REQUIRE(lt != NpyType::f4 && lt != NpyType::f8, "--labels '", lb.what, "' holds ",
               npy_type_name(lt), "; expected integer class indices");
    RT_REQUIRE(lb.header.shape.size() == 1, "--labels '", lb.what, "' has shape ",
               shape_str(lb.header.shape), "; expected [N]");
    RT_REQUIRE(lb.header.shape[0] == s[0], "--labels '", lb.what, "' holds ", lb.header.shape[0],
               " labels but --images '", images_.what, "' holds ", s[0], " images");
    labels_.resize(size_t(s[0]));
    int64_t top = -1;
    for (int64_t i = 0; i < s[0]; ++i) {
      labels_[size_t(i)] = label_at(lb, i);
      RT_REQUIRE(labels_[size_t(i)] >= 0, "--labels '", lb.what, "': record ", i,
                 " holds a negative (or above 2^63) label; expected a class index >= 0");
      top = std::max(top, labels_[size_t(i)]);
    }
    info_.num_classes = top + 1;
    RT_REQUIRE(info_.num_classes >= 2, "--labels '", lb.what,
               "' holds fewer than 2 classes (largest label ", top, ")");
  }

  void read(int64_t lo, int64_t hi, uint8_t* images, int64_t* labels) override {
    const int64_t bytes = sample_bytes();
    const uint8_t* src = images_.data.data() + lo * bytes;
    if (layout_ == "nhwc") {
      const int64_t c = info_.sample_shape[0], hw = info_.sample_shape[1] * info_.sample_shape[2];
      const size_t es = dtype_size(info_.dtype);
      for (int64_t n = 0; n < hi - lo; ++n)
        for (int64_t p = 0; p < hw; ++p)
          for (int64_t ch = 0; ch < c; ++ch)
            std::memcpy(images + n * bytes + size_t(ch * hw + p) * es,
                        src + n * bytes + size_t(p * c + ch) * es, es);
    } else {
      std::memcpy(images, src, size_t((hi - lo) * bytes));
    }
    if (info_.dtype == DType::f32) {
      const int64_t per = shape_numel(info_.sample_shape);
      const float* f = reinterpret_cast<const float*>(images);
      for (int64_t i = 0; i < (hi - lo) * per; ++i)
        RT_REQUIRE(std::isfinite(f[i]), "--images '", images_.what, "': record ", lo + i / per,
                   " holds ", f[i], "; float images must be finite");
    }
    if (info_.has_labels) std::copy(labels_.begin() + lo, labels_.begin() + hi, labels);
  }

  void read_targets(int64_t lo, int64_t hi, void* out) override {
    const int64_t per = shape_numel(info_.target_shape);
    std::memcpy(out, targets_.data() + size_t(lo * per) * 4, size_t((hi - lo) * per) * 4);
  }

 private:
  std::string layout_;
  NpyArray images_;
  std::vector<int64_t> labels_;
  std::vector<uint8_t> targets_;  // float32 or int32, 4 bytes per element

  void open_targets(const std::string& spec, int64_t n) {
    NpyArray t = read_npy(spec);
    const NpyHeader& h = t.header;
    RT_REQUIRE(h.shape.size() >= 2 && h.shape[0] == n, "--targets '", t.what, "' has shape ",
               shape_str(h.shape), "; expected [", n, ", ...] (one target per image)");
    const int64_t count = shape_numel(h.shape);
    info_.target_shape.assign(h.shape.begin() + 1, h.shape.end());
    targets_.resize(size_t(count) * 4);
    if (h.type == NpyType::f4 || h.type == NpyType::f8) {
      info_.target_dtype = DType::f32;
      float* dst = reinterpret_cast<float*>(targets_.data());
      for (int64_t i = 0; i < count; ++i) {
        double v;
        if (h.type == NpyType::f4) {
          float f;
          std::memcpy(&f, t.data.data() + size_t(i) * 4, 4);
          v = f;
        } else {
          std::memcpy(&v, t.data.data() + size_t(i) * 8, 8);
        }
        RT_REQUIRE(std::isfinite(v) && std::fabs(v) <= 3.4e38, "--targets '", t.what, "': sample ",
                   i / (count / n), " holds ", v, " at element ", i % (count / n),
                   "; float targets must be finite");
        dst[i] = float(v);
      }
      return;
    }
    info_.target_dtype = DType::i32;
    int32_t* dst = reinterpret_cast<int32_t*>(targets_.data());
    int64_t top = -1;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t v = label_at(t, i);
      const bool ignored = v == -100 && (h.type == NpyType::i1 || h.type == NpyType::i2 ||
                                         h.type == NpyType::i4 || h.type == NpyType::i8);
      RT_REQUIRE((ignored || (v >= 0 && v <= INT32_MAX)), "--targets '", t.what, "' holds ",
                 npy_type_name(h.type), " value ", v, " in sample ", i / (count / n),
                 "; expected float targets, or integer labels per position >= 0 "
                 "(or -100, ignored)");
      dst[i] = int32_t(v);
      top = std::max(top, v);
    }
    if (!info_.has_labels) info_.num_classes = std::max<int64_t>(2, top + 1);
  }
};

}  // namespace

std::unique_ptr<ConvertSource> open_npy_source(const std::string& images_spec,
                                               const std::string& labels_spec,
                                               const std::string& layout,
                                               const std::string& targets_spec) {
  return std::make_unique<NpySource>(images_spec, labels_spec, layout, targets_spec);
}

}  // namespace ringtrain::io
