// `convert cifar`: the CIFAR-10/100 binary batches (see convert_source.hpp). A record is
// <label bytes><1024 R><1024 G><1024 B> (32x32, planar: already [C, H, W]); a file must hold
// whole records. Each rank seeks to its own records.
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "io/convert_source.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {
namespace {

constexpr int64_t kPixels = 3 * 32 * 32;

class CifarSource : public ConvertSource {
 public:
  CifarSource(const std::vector<std::string>& files, bool cifar100)
      : files_(files), label_bytes_(cifar100 ? 2 : 1) {
    RT_REQUIRE(!files.empty(), "--input: expected at least one CIFAR batch file");
    const int64_t record = label_bytes_ + kPixels;
    for (const auto& f : files) {
      std::error_code ec;
      RT_REQUIRE(fs::is_regular_file(f, ec), "--input '", f, "' does not exist or is not a file");
      const int64_t size = int64_t(fs::file_size(f, ec));
      RT_REQUIRE(size > 0 && size % record == 0, "--input '", f, "' holds ", size,
                 " bytes, which is not a multiple of the ", record, "-byte ",
                 cifar100 ? "CIFAR-100" : "CIFAR-10", " record (",
                 cifar100 ? "coarse label, fine label" : "label", ", 3072 pixels)",
                 cifar100 ? "" : "; for CIFAR-100 files add --cifar100");
      first_.push_back(info_.num_samples);
      info_.num_samples += size / record;
    }
    first_.push_back(info_.num_samples);
    info_.sample_shape = {3, 32, 32};
    info_.dtype = DType::u8;
    info_.num_classes = cifar100 ? 100 : 10;
    // batches.meta.txt / fine_label_names.txt: one class name per line.
    const fs::path names =
        fs::path(files[0]).parent_path() / (cifar100 ? "fine_label_names.txt" : "batches.meta.txt");
    std::error_code ec;
    std::ifstream in;  // optional; a FIFO of that name would block the read
    if (fs::is_regular_file(names, ec)) in.open(names);
    for (std::string line; in && std::getline(in, line);)
      if (!line.empty() && line.find_first_not_of(" \r") != std::string::npos)
        info_.class_names.push_back(line.substr(0, line.find_last_not_of(" \r") + 1));
    if (int64_t(info_.class_names.size()) != info_.num_classes) info_.class_names.clear();
  }

  void read(int64_t lo, int64_t hi, uint8_t* images, int64_t* labels) override {
    const int64_t record = label_bytes_ + kPixels;
    std::vector<char> buf(static_cast<size_t>(record));
    for (size_t f = 0; f < files_.size() && lo < hi; ++f) {
      if (lo >= first_[f + 1]) continue;
      std::ifstream in(files_[f], std::ios::binary);
      RT_REQUIRE(in, "--input '", files_[f], "' cannot be opened");
      in.seekg((lo - first_[f]) * record);
      for (; lo < hi && lo < first_[f + 1]; ++lo) {
        RT_REQUIRE(in.read(buf.data(), record), "--input '", files_[f], "': record ",
                   lo - first_[f], " cannot be read (the file shrank?)");
        const int64_t label = static_cast<uint8_t>(buf[size_t(label_bytes_ - 1)]);
        RT_REQUIRE(label < info_.num_classes, "--input '", files_[f], "': record ", lo - first_[f],
                   " has label ", label, "; expected 0 to ", info_.num_classes - 1,
                   label_bytes_ == 1 ? " (a CIFAR-100 file? add --cifar100)" : "");
        *labels++ = label;
        std::copy(buf.begin() + label_bytes_, buf.end(), images);
        images += kPixels;
      }
    }
  }

 private:
  std::vector<std::string> files_;
  int64_t label_bytes_;
  std::vector<int64_t> first_;  // first global record of each file, then the total
};

}  // namespace

std::unique_ptr<ConvertSource> open_cifar(const std::vector<std::string>& files, bool cifar100) {
  return std::make_unique<CifarSource>(files, cifar100);
}

}  // namespace ringtrain::io
