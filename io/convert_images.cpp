// `convert images`: the ImageFolder layout (see convert_source.hpp). Listing the folders is
// cheap and done by every rank the same way (sorted names), so the global sample index is
// the same everywhere and each rank decodes only its own range.
#include <algorithm>
#include <cctype>
#include <filesystem>

#include "core/error.hpp"
#include "io/convert_source.hpp"
#include "io/image_decode.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {
namespace {

bool is_image_name(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

class ImageFolderSource : public ConvertSource {
 public:
  ImageFolderSource(const std::string& root, int64_t height, int64_t width, int channels)
      : resize_(height > 0), channels_(channels) {
    std::error_code ec;
    RT_REQUIRE(fs::is_directory(root, ec), "--root '", root,
               "' is not a directory; expected ROOT/<class>/<image>.png|.jpg");
    std::vector<fs::path> classes;
    for (const auto& e : fs::directory_iterator(root, ec))
      if (e.is_directory()) classes.push_back(e.path());
    RT_REQUIRE(!ec, "--root '", root, "' cannot be listed: ", ec.message());
    std::sort(classes.begin(), classes.end());
    RT_REQUIRE(classes.size() >= 2, "--root '", root, "' holds ", classes.size(),
               " class folder(s); expected at least 2 subfolders, one per class");
    for (size_t k = 0; k < classes.size(); ++k) {
      std::vector<std::string> files;
      for (const auto& e : fs::directory_iterator(classes[k], ec))
        if (e.is_regular_file() && is_image_name(e.path())) files.push_back(e.path().string());
      RT_REQUIRE(!ec, "class folder '", classes[k].string(), "' cannot be listed: ", ec.message());
      RT_REQUIRE(!files.empty(), "class folder '", classes[k].string(),
                 "' holds no .png, .jpg or .jpeg image; every class needs at least one (remove "
                 "the folder to drop the class)");
      std::sort(files.begin(), files.end());
      for (auto& f : files) {
        files_.push_back(std::move(f));
        labels_.push_back(int64_t(k));
      }
      info_.class_names.push_back(classes[k].filename().string());
    }
    info_.num_samples = int64_t(files_.size());
    info_.num_classes = int64_t(classes.size());
    info_.dtype = DType::u8;
    if (resize_) {
      height_ = height;
      width_ = width;
    } else {  // every image must have the size of the first (probed from its header)
      const ImageSize s = probe_image_size(files_[0]);
      height_ = s.height;
      width_ = s.width;
    }
    info_.sample_shape = {channels, height_, width_};
  }

  void read(int64_t lo, int64_t hi, uint8_t* images, int64_t* labels) override {
    const int64_t bytes = sample_bytes();
    for (int64_t i = lo; i < hi; ++i) {
      const std::string& f = files_[size_t(i)];
      const Image im = decode_image(f, channels_);
      uint8_t* out = images + (i - lo) * bytes;
      if (resize_) {
        resize_center_crop(im, height_, width_, out);
      } else {
        RT_REQUIRE(im.height == height_ && im.width == width_, "image '", f, "' (record ", i,
                   ") is ", im.height, "x", im.width, " (HxW) but '", files_[0],
                   "', the first image, is ", height_, "x", width_,
                   "; all images must have one size, or give --size H,W to resize them");
        to_planar(im, out);
      }
      labels[i - lo] = labels_[size_t(i)];
    }
  }

 private:
  bool resize_;
  int channels_;
  int64_t height_ = 0, width_ = 0;
  std::vector<std::string> files_;
  std::vector<int64_t> labels_;
};

}  // namespace

std::unique_ptr<ConvertSource> open_image_folder(const std::string& root, int64_t height,
                                                 int64_t width, int channels) {
  return std::make_unique<ImageFolderSource>(root, height, width, channels);
}

}  // namespace ringtrain::io
