// The option tables of `ringtrain convert idx|npy|images|cifar|text`: each format's inputs,
// the output every format shares (--out, --shards), and the `convert` dispatcher's own
// (see options.hpp).
#include <algorithm>

#include "core/error.hpp"
#include "launch/option_parsing.hpp"
#include "launch/options.hpp"

namespace ringtrain::launch {

using namespace opts;  // NOLINT: the tables are written in the helpers' vocabulary

namespace {

// --out and --shards, shared by every convert format.
po::options_description convert_output_options(ConvertConfig& c) {
  po::options_description out("output");
  // clang-format off
  out.add_options()
      ("out", po::value(&c.out)->required(), "output dataset file (.h5); its directory is created if missing")
      ("shards", value_or_default(&c.shards), "split into N files OUT-00000-of-0000N.h5");
  // clang-format on
  return out;
}

// Parses one convert format's table; false on --help / --print-config (as parse()).
bool parse_convert_format(const char* command, po::options_description& in,
                          const std::vector<std::string>& args, ConvertConfig& c,
                          std::string* help) {
  po::options_description desc(cat(command, " options"));
  desc.add(general_options()).add(in).add(convert_output_options(c)).add(debug_options());
  po::variables_map vm;
  if (!parse(command, desc, args, vm, help)) return false;
  RT_REQUIRE(c.shards >= 1, "--shards ", c.shards, " is not valid: must be >= 1");
  if (vm.count("print-config")) {
    *help = config_text(desc, vm);
    return false;
  }
  return true;
}

}  // namespace

bool parse_convert_npy(const std::vector<std::string>& args, ConvertConfig& c, std::string* help) {
  po::options_description in("input");
  // clang-format off
  in.add_options()
      ("images", po::value(&c.images)->required(), "images: X.npy, X.npz:KEY or X.npz (one array); uint8 or float32")
      ("labels", po::value(&c.labels), "labels [N] of any integer dtype: Y.npy or Y.npz:KEY (none: unlabelled, for predict)")
      ("targets", po::value(&c.targets), "targets [N, ...] as /targets: float (regression, multi-label 0/1) or integer labels per position (segmentation; -100 ignored): T.npy or T.npz:KEY")
      ("layout", value_or_default(&c.layout), "nchw | nhwc: the order of 4-d images");
  // clang-format on
  if (!parse_convert_format("convert npy", in, args, c, help)) return false;
  RT_REQUIRE(c.layout == "nchw" || c.layout == "nhwc", "--layout '", c.layout,
             "' is not known; expected nchw or nhwc");
  return true;
}

bool parse_convert_images(const std::vector<std::string>& args, ConvertConfig& c,
                          std::string* help) {
  po::options_description in("input");
  // clang-format off
  in.add_options()
      ("root", po::value(&c.root)->required(), "ROOT/<class>/<image>.png|.jpg|.jpeg, one folder per class")
      ("size", po::value(&c.size), "H,W: resize each image to cover H x W and crop the centre (none: all images must have one size)")
      ("grayscale", po::bool_switch(&c.grayscale), "1 channel (luma) instead of RGB");
  // clang-format on
  if (!parse_convert_format("convert images", in, args, c, help)) return false;
  if (!c.size.empty()) {
    const char* expected = "H,W (two positive integers up to 65536), e.g. 64,64";
    const std::vector<int64_t> hw = parse_int_list(c.size, "--size", expected);
    RT_REQUIRE(hw.size() == 2 && hw[0] <= 65536 && hw[1] <= 65536, "--size '", c.size,
               "' is not valid; expected ", expected);
    c.height = hw[0];
    c.width = hw[1];
  }
  return true;
}

bool parse_convert_cifar(const std::vector<std::string>& args, ConvertConfig& c,
                         std::string* help) {
  po::options_description in("input");
  // clang-format off
  in.add_options()
      ("input", po::value(&c.inputs)->required()->multitoken(), "CIFAR binary batch files (data_batch_*.bin, test_batch.bin; train.bin, test.bin), concatenated in the order given")
      ("cifar100", po::bool_switch(&c.cifar100), "CIFAR-100 records (coarse and fine label; the fine label is used)");
  // clang-format on
  return parse_convert_format("convert cifar", in, args, c, help);
}

bool parse_convert_text(const std::vector<std::string>& args, ConvertConfig& c, std::string* help) {
  po::options_description in("input");
  // clang-format off
  in.add_options()
      ("input", po::value(&c.inputs)->required()->multitoken(), "text files, directories (all files below) or globs (** matches any directories), one document per file, in the order given")
      ("val-fraction", value_or_default(&c.val_fraction), "held out as OUT-val.h5: every (1/F)-th document (or the last F of a corpus of fewer than 1/F documents); 0: none")
      ("max-input-mb", value_or_default(&c.max_input_mb), "refuse inputs of more than M MiB in all, before reading any (converting takes about 9 bytes of memory per input byte)")
      ("tokenizer", po::value(&c.tokenizer), "a SentencePiece model file (`ringtrain tokenizer train`): its tokens instead of bytes, with its end-of-text id (eos) after each document")
      ("threads", value_or_default(&c.threads), "--tokenizer: encoding threads on rank 0 (0: every core)");
  // clang-format on
  if (!parse_convert_format("convert text", in, args, c, help)) return false;
  RT_REQUIRE(c.threads >= 0 && c.threads <= 4096, "--threads ", c.threads,
             " is not valid; expected 0 (every core) to 4096");
  RT_REQUIRE(c.max_input_mb >= 1 && c.max_input_mb <= (int64_t(1) << 40), "--max-input-mb ",
             c.max_input_mb, " is not valid; expected 1 to 1099511627776 (MiB)");
  RT_REQUIRE(c.val_fraction >= 0 && c.val_fraction < 1, "--val-fraction ", c.val_fraction,
             " is not valid; expected a fraction in [0, 1), e.g. 0.1");
  return true;
}

bool parse_convert_hf(const std::vector<std::string>& args, ConvertConfig& c, std::string* help) {
  // clang-format off
  po::options_description in("input and output");
  in.add_options()
      ("in", po::value(&c.hf_dir)->required(), "a Hugging Face model directory: config.json (model_type gpt2 or llama) and model.safetensors, or the shards model.safetensors.index.json names")
      ("out", po::value(&c.out)->required(), "the ringtrain checkpoint to write (ckpt.h5); its directory is created if missing");
  // clang-format on
  po::options_description desc("convert hf options");
  desc.add(general_options()).add(in).add(debug_options());
  po::variables_map vm;
  if (!parse("convert hf", desc, args, vm, help)) return false;
  if (vm.count("print-config")) {
    *help = config_text(desc, vm);
    return false;
  }
  return true;
}

bool parse_convert(const std::vector<std::string>& args, ConvertConfig& c, std::string* help) {
  // clang-format off
  po::options_description in("input");
  in.add_options()
      ("images", po::value(&c.images)->required(), "IDX images file (.gz or plain)")
      ("labels", po::value(&c.labels)->required(), "IDX labels file (.gz or plain)");
  po::options_description out("output");
  out.add_options()
      ("out", po::value(&c.out)->required(), "output dataset file (.h5); its directory is created if missing")
      ("shards", value_or_default(&c.shards), "split into N files OUT-00000-of-0000N.h5");
  // clang-format on
  po::options_description desc("convert idx options");
  desc.add(general_options()).add(in).add(out).add(debug_options());
  po::variables_map vm;
  if (!parse("convert idx", desc, args, vm, help)) return false;
  RT_REQUIRE(c.shards >= 1, "--shards ", c.shards, " is not valid: must be >= 1");
  if (vm.count("print-config")) {
    *help = config_text(desc, vm);
    return false;
  }
  return true;
}

}  // namespace ringtrain::launch

namespace ringtrain::launch {

bool parse_tokenizer_train(const std::vector<std::string>& args, TokenizerTrainConfig& c,
                           std::string* help) {
  po::options_description in("tokenizer train options");
  // clang-format off
  in.add_options()
      ("input", po::value(&c.inputs)->required()->multitoken(), "text files, directories or globs (as convert text); the trainer reads them line by line")
      ("vocab-size", po::value(&c.vocab_size)->required(), "pieces in the vocabulary (at least 300: 256 byte pieces, <unk> <s> </s>, a newline piece and the corpus' characters)")
      ("model-type", value_or_default(&c.model_type), "bpe | unigram")
      ("out", po::value(&c.out)->required(), "the model file to write (e.g. tok.model)")
      ("threads", value_or_default(&c.threads), "training threads (0: every core)")
      ("max-input-mb", value_or_default(&c.max_input_mb), "refuse inputs of more than M MiB in all, before reading any");
  // clang-format on
  po::options_description desc("tokenizer train options");
  desc.add(general_options()).add(in).add(debug_options());
  po::variables_map vm;
  if (!parse("tokenizer train", desc, args, vm, help)) return false;
  RT_REQUIRE(c.vocab_size >= 300 && c.vocab_size <= 1000000, "--vocab-size ", c.vocab_size,
             " is not valid; expected 300 to 1000000 (256 byte pieces and the special pieces "
             "come first)");
  RT_REQUIRE(c.model_type == "bpe" || c.model_type == "unigram", "--model-type '", c.model_type,
             "' is not valid; expected bpe or unigram");
  RT_REQUIRE(c.threads >= 0 && c.threads <= 4096, "--threads ", c.threads,
             " is not valid; expected 0 (every core) to 4096");
  RT_REQUIRE(c.max_input_mb >= 1 && c.max_input_mb <= (int64_t(1) << 40), "--max-input-mb ",
             c.max_input_mb, " is not valid; expected 1 to 1099511627776 (MiB)");
  if (vm.count("print-config")) {
    *help = config_text(desc, vm);
    return false;
  }
  return true;
}

}  // namespace ringtrain::launch
