// Image files in, for `ringtrain convert images`: PNG through libpng's simplified API and
// JPEG through libjpeg-turbo (both from Debian), chosen by the file's magic bytes, decoded
// to 8-bit RGB or grayscale; and the resize + centre crop that brings images of any size to
// one [C, H, W] sample. Every problem is an input error naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ringtrain::io {

// The most pixels (height x width) an image may declare: 16384 x 16384. A larger one is an
// input error before it is decoded (docs/data.md, "Limits").
inline constexpr int64_t kMaxImagePixels = int64_t(1) << 28;

struct Image {
  int64_t height = 0, width = 0, channels = 0;  // channels: 1 (gray) or 3 (RGB)
  std::vector<uint8_t> pixels;                  // [height, width, channels], interleaved
};

// Width and height from the header only (no pixel data decoded).
struct ImageSize {
  int64_t height = 0, width = 0;
};
ImageSize probe_image_size(const std::string& path);

// Decodes a PNG or JPEG into `channels` (1 or 3) channels: RGB from gray is replicated,
// gray from RGB is libpng's/libjpeg's luma; alpha is composited onto black. A truncated or
// corrupt file (libjpeg's "premature end" warnings included) is an input error.
Image decode_image(const std::string& path, int channels);
Image decode_image_bytes(const uint8_t* data, size_t n, int channels, const std::string& what);

// Scales `in` so that it covers height x width (the larger of the two scale factors, so no
// side is padded), with a triangle (bilinear, widened when shrinking) filter, and crops the
// centre; writes [channels, height, width] to out.
void resize_center_crop(const Image& in, int64_t height, int64_t width, uint8_t* out);

// [H, W, C] interleaved -> [C, H, W] planar, no resampling (the image already has the size).
void to_planar(const Image& in, uint8_t* out);

}  // namespace ringtrain::io
