// PNG/JPEG decoding and resize + centre crop (see image_decode.hpp). libjpeg reports errors
// by longjmp from its error manager: the decode function keeps everything it owns in
// objects created before setjmp, and turns warnings (corrupt data that libjpeg would
// otherwise fill with grey) into errors too.
#include "io/image_decode.hpp"

// jpeglib.h needs size_t and FILE declared first.
#include <csetjmp>
#include <cstdio>
// clang-format off
#include <jpeglib.h>
// clang-format on
#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "core/files.hpp"

namespace ringtrain::io {
namespace {

bool is_png(const uint8_t* d, size_t n) {
  static const uint8_t sig[] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
  return n >= 8 && std::memcmp(d, sig, 8) == 0;
}
bool is_jpeg(const uint8_t* d, size_t n) {
  return n >= 3 && d[0] == 0xff && d[1] == 0xd8 && d[2] == 0xff;
}

std::vector<uint8_t> read_all(const std::string& path) {
  require_regular_file(path, "image", "a .png or .jpg file");
  std::ifstream in(path, std::ios::binary);
  RT_REQUIRE(in, "image '", path, "' cannot be opened");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  return bytes;
}

// The size a header declares, checked before any pixel is decoded: the pixels of a
// 60000 x 60000 PNG of a few hundred bytes would take 10 GiB.
void require_decodable(uint64_t height, uint64_t width, const std::string& what) {
  RT_REQUIRE(height * width <= uint64_t(kMaxImagePixels), "image '", what, "' declares ", height,
             "x", width, " (HxW) pixels; at most ", kMaxImagePixels,
             " pixels are decoded (the limit); downscale it first");
}

[[noreturn]] void not_an_image(const std::string& what) {
  throw_input(cat("image '", what,
                  "' is neither PNG nor JPEG (by its first bytes); expected a .png "
                  "or .jpg file"));
}

// ---- PNG ------------------------------------------------------------------------------

Image decode_png(const uint8_t* data, size_t n, int channels, const std::string& what) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, data, n))
    throw_input(cat("image '", what, "' is not a valid PNG: ", img.message));
  try {
    require_decodable(img.height, img.width, what);
  } catch (...) {
    png_image_free(&img);
    throw;
  }
  img.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  Image out;
  out.height = img.height;
  out.width = img.width;
  out.channels = channels;
  out.pixels.resize(size_t(out.height * out.width * channels));
  const png_color black = {0, 0, 0};
  if (!png_image_finish_read(&img, &black, out.pixels.data(), 0, nullptr)) {
    const std::string why = img.message;
    png_image_free(&img);
    throw_input(cat("image '", what, "' is a corrupt PNG: ", why));
  }
  return out;
}

// ---- JPEG -----------------------------------------------------------------------------

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_fail(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegError*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings (level -1) are corrupt data that libjpeg would decode as grey: an error here.
void jpeg_message(j_common_ptr c, int level) {
  if (level < 0) jpeg_fail(c);
}

struct JpegDecoder {  // owns the libjpeg state, destroyed however decoding ends
  jpeg_decompress_struct info;
  JpegError err;
  bool created = false;
  ~JpegDecoder() {
    if (created) jpeg_destroy_decompress(&info);
  }
};

// Reads the header (and, if `pixels` is given, the whole image) of a JPEG; returns false
// with err.message set on failure. Kept free of C++ objects with destructors between
// setjmp and the end, as longjmp requires.
bool run_jpeg(JpegDecoder& d, const uint8_t* data, size_t n, int channels, Image* out) {
  d.info.err = jpeg_std_error(&d.err.mgr);
  d.err.mgr.error_exit = jpeg_fail;
  d.err.mgr.emit_message = jpeg_message;
  if (setjmp(d.err.jump)) return false;
  jpeg_create_decompress(&d.info);
  d.created = true;
  jpeg_mem_src(&d.info, data, static_cast<unsigned long>(n));
  jpeg_read_header(&d.info, TRUE);
  if (!out) return true;
  if (d.info.jpeg_color_space == JCS_CMYK || d.info.jpeg_color_space == JCS_YCCK) {
    std::snprintf(d.err.message, sizeof d.err.message,
                  "CMYK JPEG is not supported; convert it to RGB");
    return false;
  }
  d.info.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&d.info);
  const size_t row = size_t(d.info.output_width) * size_t(channels);
  uint8_t* base = out->pixels.data();
  if (out->pixels.size() != row * d.info.output_height) return false;  // sized by the caller
  while (d.info.output_scanline < d.info.output_height) {
    JSAMPROW r = base + size_t(d.info.output_scanline) * row;
    jpeg_read_scanlines(&d.info, &r, 1);
  }
  jpeg_finish_decompress(&d.info);
  return true;
}

Image decode_jpeg(const uint8_t* data, size_t n, int channels, const std::string& what) {
  Image out;
  {
    JpegDecoder probe;
    if (!run_jpeg(probe, data, n, channels, nullptr))
      throw_input(cat("image '", what, "' is not a valid JPEG: ", probe.err.message));
    out.height = probe.info.image_height;
    out.width = probe.info.image_width;
  }
  require_decodable(uint64_t(out.height), uint64_t(out.width), what);
  out.channels = channels;
  out.pixels.resize(size_t(out.height * out.width * channels));
  JpegDecoder d;
  if (!run_jpeg(d, data, n, channels, &out))
    throw_input(cat("image '", what, "' is a corrupt JPEG: ", d.err.message));
  return out;
}

// ---- resampling -----------------------------------------------------------------------

// Weights of a triangle filter taking `in` samples to output positions [first, first + count)
// of an axis scaled to `scaled` samples. Filter radius 1 input sample when enlarging, the
// scale factor when shrinking (so every input sample contributes: area averaging).
struct Taps {
  std::vector<int64_t> start, len;
  std::vector<float> w;  // len[i] weights per output, at offset i * max_len
  int64_t max_len = 0;
};

Taps make_taps(int64_t in, int64_t scaled, int64_t first, int64_t count) {
  const double scale = double(in) / double(scaled);  // input samples per output sample
  const double radius = std::max(1.0, scale);
  Taps t;
  t.max_len = int64_t(std::ceil(radius)) * 2 + 2;
  t.start.resize(size_t(count));
  t.len.resize(size_t(count));
  t.w.assign(size_t(count * t.max_len), 0.f);
  for (int64_t i = 0; i < count; ++i) {
    const double centre = (double(first + i) + 0.5) * scale;  // in input coordinates
    int64_t lo = std::max<int64_t>(0, int64_t(std::floor(centre - radius)));
    int64_t hi = std::min<int64_t>(in, int64_t(std::ceil(centre + radius)));
    double sum = 0;
    std::vector<double> w;
    for (int64_t j = lo; j < hi; ++j) {
      const double v = std::max(0.0, 1.0 - std::fabs((double(j) + 0.5 - centre) / radius));
      w.push_back(v);
      sum += v;
    }
    // Trim zero weights at both ends so the loops stay short.
    int64_t a = 0, b = int64_t(w.size());
    while (a < b && w[size_t(a)] == 0) ++a;
    while (b > a && w[size_t(b - 1)] == 0) --b;
    if (a == b) {  // cannot happen for radius >= 1, but keep a sample
      a = 0;
      b = 1;
      w[0] = sum = 1;
    }
    t.start[size_t(i)] = lo + a;
    t.len[size_t(i)] = std::min(b - a, t.max_len);
    for (int64_t k = 0; k < t.len[size_t(i)]; ++k)
      t.w[size_t(i * t.max_len + k)] = float(w[size_t(a + k)] / sum);
  }
  return t;
}

}  // namespace

ImageSize probe_image_size(const std::string& path) {
  const std::vector<uint8_t> b = read_all(path);
  if (is_png(b.data(), b.size())) {
    png_image img;
    std::memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&img, b.data(), b.size()))
      throw_input(cat("image '", path, "' is not a valid PNG: ", img.message));
    png_image_free(&img);
    require_decodable(img.height, img.width, path);
    return {int64_t(img.height), int64_t(img.width)};
  }
  if (is_jpeg(b.data(), b.size())) {
    JpegDecoder d;
    if (!run_jpeg(d, b.data(), b.size(), 3, nullptr))
      throw_input(cat("image '", path, "' is not a valid JPEG: ", d.err.message));
    require_decodable(d.info.image_height, d.info.image_width, path);
    return {int64_t(d.info.image_height), int64_t(d.info.image_width)};
  }
  not_an_image(path);
}

Image decode_image_bytes(const uint8_t* data, size_t n, int channels, const std::string& what) {
  RT_REQUIRE(channels == 1 || channels == 3, "decode_image: channels must be 1 or 3");
  if (is_png(data, n)) return decode_png(data, n, channels, what);
  if (is_jpeg(data, n)) return decode_jpeg(data, n, channels, what);
  not_an_image(what);
}

Image decode_image(const std::string& path, int channels) {
  const std::vector<uint8_t> b = read_all(path);
  return decode_image_bytes(b.data(), b.size(), channels, path);
}

void resize_center_crop(const Image& in, int64_t height, int64_t width, uint8_t* out) {
  const int64_t c = in.channels;
  const double s = std::max(double(height) / double(in.height), double(width) / double(in.width));
  // The scaled size covers the target; rounding may not shrink it below the target.
  const int64_t sh = std::max(height, int64_t(std::llround(double(in.height) * s)));
  const int64_t sw = std::max(width, int64_t(std::llround(double(in.width) * s)));
  const Taps ty = make_taps(in.height, sh, (sh - height) / 2, height);
  const Taps tx = make_taps(in.width, sw, (sw - width) / 2, width);
  // Vertical pass into [height, in.width, c] floats, then horizontal into planar bytes.
  std::vector<float> mid(size_t(height * in.width * c), 0.f);
  for (int64_t y = 0; y < height; ++y) {
    float* dst = mid.data() + y * in.width * c;
    for (int64_t k = 0; k < ty.len[size_t(y)]; ++k) {
      const float w = ty.w[size_t(y * ty.max_len + k)];
      const uint8_t* src = in.pixels.data() + (ty.start[size_t(y)] + k) * in.width * c;
      for (int64_t i = 0; i < in.width * c; ++i) dst[i] += w * float(src[i]);
    }
  }
  for (int64_t y = 0; y < height; ++y) {
    const float* row = mid.data() + y * in.width * c;
    for (int64_t x = 0; x < width; ++x) {
      for (int64_t ch = 0; ch < c; ++ch) {
        float v = 0;
        for (int64_t k = 0; k < tx.len[size_t(x)]; ++k)
          v += tx.w[size_t(x * tx.max_len + k)] * row[(tx.start[size_t(x)] + k) * c + ch];
        out[(ch * height + y) * width + x] = uint8_t(std::clamp(std::lround(v), 0L, 255L));
      }
    }
  }
}

void to_planar(const Image& in, uint8_t* out) {
  const int64_t hw = in.height * in.width, c = in.channels;
  for (int64_t p = 0; p < hw; ++p)
    for (int64_t ch = 0; ch < c; ++ch) out[ch * hw + p] = in.pixels[size_t(p * c + ch)];
}

}  // namespace ringtrain::io
