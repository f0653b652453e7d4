// The SentencePiece calls of io/tokenizer.cpp behind a C interface, built as a module
// (librt_sentencepiece.so) that tokenizer.cpp opens with RTLD_DEEPBIND. Debian's
// libsentencepiece carries its own copy of protobuf-lite (3.14) with exported symbols, while
// ringtrain links the system libprotobuf (3.21, for model files and ONNX): linked into one
// program the two resolve to one copy and SentencePiece aborts on its version check. Opened
// as a deep-bound module, SentencePiece binds to its own copy. No exception crosses the
// interface: failures come back as a message in `err`.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using Sink = void (*)(void* ctx, const char* data, size_t n);

void set_error(char* err, size_t cap, const std::string& msg) {
  if (cap == 0) return;
  const size_t n = std::min(cap - 1, msg.size());
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

// The corpus line by line, for the trainer (which samples at most input_sentence_size lines).
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(std::vector<std::string> files) : files_(std::move(files)) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    while (true) {
      if (in_.is_open() && std::getline(in_, line_)) return;
      if (in_.is_open() && in_.bad()) {
        status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kDataLoss,
                                              "read error in '" + files_[next_ - 1] + "'");
        done_ = true;
        return;
      }
      in_.close();
      in_.clear();
      if (next_ == files_.size()) {
        done_ = true;
        return;
      }
      in_.open(files_[next_++], std::ios::binary);
    }
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return status_; }

 private:
  std::vector<std::string> files_;
  size_t next_ = 0;
  std::ifstream in_;
  std::string line_;
  bool done_ = false;
  sentencepiece::util::Status status_;
};

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* rt_spm_load(const char* bytes, size_t n, char* err,
                                                         size_t cap) {
  try {
    auto* sp = new sentencepiece::SentencePieceProcessor();
    const auto status = sp->LoadFromSerializedProto(std::string_view(bytes, n));
    if (status.ok()) return sp;
    set_error(err, cap, status.ToString());
    delete sp;
  } catch (const std::exception& e) {
    set_error(err, cap, e.what());
  }
  return nullptr;
}

__attribute__((visibility("default"))) void rt_spm_free(void* sp) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(sp);
}

__attribute__((visibility("default"))) int rt_spm_piece_size(const void* sp) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(sp)->GetPieceSize();
}

__attribute__((visibility("default"))) int rt_spm_eos_id(const void* sp) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(sp)->eos_id();
}

// Appends the ids of text[0..n) to `out` (an int array sink: data and n count bytes).
__attribute__((visibility("default"))) int rt_spm_encode(const void* sp, const char* text, size_t n,
                                                         Sink out, void* ctx, char* err,
                                                         size_t cap) {
  try {
    std::vector<int> ids;
    const auto status = static_cast<const sentencepiece::SentencePieceProcessor*>(sp)->Encode(
        std::string_view(text, n), &ids);
    if (!status.ok()) {
      set_error(err, cap, status.ToString());
      return 1;
    }
    out(ctx, reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int));
    return 0;
  } catch (const std::exception& e) {
    set_error(err, cap, e.what());
    return 1;
  }
}

__attribute__((visibility("default"))) int rt_spm_decode(const void* sp, const int* ids, size_t n,
                                                         Sink out, void* ctx, char* err,
                                                         size_t cap) {
  try {
    std::string text;
    const auto status = static_cast<const sentencepiece::SentencePieceProcessor*>(sp)->Decode(
        std::vector<int>(ids, ids + n), &text);
    if (!status.ok()) {
      set_error(err, cap, status.ToString());
      return 1;
    }
    out(ctx, text.data(), text.size());
    return 0;
  } catch (const std::exception& e) {
    set_error(err, cap, e.what());
    return 1;
  }
}

// Trains on the lines of files[0..nfiles) with the options keys[i]=values[i]; the model's
// serialized bytes go to `out`.
__attribute__((visibility("default"))) int rt_spm_train(const char* const* keys,
                                                        const char* const* values, size_t nkv,
                                                        const char* const* files, size_t nfiles,
                                                        Sink out, void* ctx, char* err,
                                                        size_t cap) {
  try {
    std::unordered_map<std::string, std::string> args;
    for (size_t i = 0; i < nkv; ++i) args[keys[i]] = values[i];
    LineIterator lines(std::vector<std::string>(files, files + nfiles));
    std::string model;
    const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
    if (!status.ok()) {
      set_error(err, cap, status.ToString());
      return 1;
    }
    out(ctx, model.data(), model.size());
    return 0;
  } catch (const std::exception& e) {
    set_error(err, cap, e.what());
    return 1;
  }
}

}  // extern "C"
