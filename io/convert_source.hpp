// The inputs of `ringtrain convert npy|images|cifar`: each opens its files on every rank,
// says what the dataset will hold (count, sample shape, dtype, classes, class names), and
// reads any contiguous range of samples, so that under mpirun each rank reads (and
// decodes) only its own slice. Problems are input errors naming the file and record.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace ringtrain::io {

struct SourceInfo {
  int64_t num_samples = 0;
  Shape sample_shape;  // [C, H, W] or [D]
  DType dtype = DType::u8;
  bool has_labels = true;
  int64_t num_classes = 0;               // 0 when there are no labels
  std::vector<std::string> class_names;  // empty when the source has none
  // /targets (npy --targets): one sample's shape (empty: none) and dtype (f32 or i32).
  Shape target_shape;
  DType target_dtype = DType::f32;
};

class ConvertSource {
 public:
  virtual ~ConvertSource() = default;
  const SourceInfo& info() const { return info_; }
  int64_t sample_bytes() const {
    return shape_numel(info_.sample_shape) * int64_t(dtype_size(info_.dtype));
  }
  // Samples [lo, hi) into images ((hi - lo) samples, [C, H, W] each, as stored) and, when the
  // source has labels, labels (hi - lo values).
  virtual void read(int64_t lo, int64_t hi, uint8_t* images, int64_t* labels) = 0;
  // The targets of samples [lo, hi) (4 bytes per element, as target_dtype), when the source
  // has them.
  virtual void read_targets(int64_t lo, int64_t hi, void* targets) {}

 protected:
  SourceInfo info_;
};

// NumPy arrays: images [N, C, H, W] (layout "nchw"), [N, H, W, C] ("nhwc"), [N, H, W] (one
// channel) or [N, D], uint8 or float32 (finite); labels [N] of any integer dtype, values
// >= 0 (num_classes = largest + 1), or none (labels_spec empty).
// targets_spec: float targets [N, ...] (float32 or float64, finite) or integer targets
// [N, ...] (labels per position, >= 0 or -100 (ignored); num_classes = the largest + 1 when
// there are no labels), or none.
std::unique_ptr<ConvertSource> open_npy_source(const std::string& images_spec,
                                               const std::string& labels_spec,
                                               const std::string& layout,
                                               const std::string& targets_spec = {});

// The ImageFolder layout: ROOT/<class>/<image>.png|.jpg|.jpeg, classes in name order (label
// k = the k-th subfolder), images in name order within each. size {0, 0}: every image must
// have the size of the first; else each is resized to cover and centre-cropped. channels 3
// (RGB) or 1 (grayscale).
std::unique_ptr<ConvertSource> open_image_folder(const std::string& root, int64_t height,
                                                 int64_t width, int channels);

// CIFAR-10 (<1 x label><3072 x pixel>) or CIFAR-100 (<1 x coarse><1 x fine><3072 x pixel>)
// binary batches, concatenated in the order given; the fine label for CIFAR-100. Class
// names come from batches.meta.txt (CIFAR-10) or fine_label_names.txt (CIFAR-100) next to
// the first file, when present.
std::unique_ptr<ConvertSource> open_cifar(const std::vector<std::string>& files, bool cifar100);

}  // namespace ringtrain::io
