// train, eval, convert and inspect (see commands.hpp).
#include "launch/commands.hpp"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "io/checkpoint.hpp"
#include "io/hdf5.hpp"
#include "io/idx.hpp"
#include "launch/device.hpp"
#include "launch/evaluate.hpp"
#include "launch/job.hpp"
#include "launch/metrics.hpp"
#include "launch/options.hpp"
#include "launch/signals.hpp"
#include "launch/trainer.hpp"

namespace ringtrain::launch {
namespace {

// Parses the options on every rank under agree(); on --help, rank 0 prints the help and
// the command has nothing more to do (returns false).
template <typename Config>
bool parse_agreed(bool (*parse)(const std::vector<std::string>&, Config&, std::string*),
                  const std::vector<std::string>& args, Config& cfg, comm::Communicator& comm) {
  std::string help;
  bool run = true;
  agree(comm, [&] { run = parse(args, cfg, &help); });
  if (!run && comm.rank() == 0) std::cout << help;
  return run;
}

}  // namespace

int cmd_train(const std::vector<std::string>& args, comm::Communicator& comm) {
  install_stop_handlers();  // from the start: a signal during setup stops at the first step
  TrainConfig cfg;
  if (!parse_agreed(parse_train, args, cfg, comm)) return 0;
  // hierarchical, or on cuda NCCL or MPI staged through host memory; null: comm itself.
  std::unique_ptr<comm::Communicator> own = make_train_communicator(cfg, comm);
  // Setup agrees on its errors; from the first collective on, an error ends the job from
  // the rank that saw it, with the trainer (its threads, open files) left as it is.
  std::optional<Trainer> trainer;
  run_or_fail([&] { trainer.emplace(cfg, own ? *own : comm); });
  return run_or_fail([&] { return trainer->run(); });
}

int cmd_eval(const std::vector<std::string>& args, comm::Communicator& comm) {
  EvalConfig cfg;
  if (!parse_agreed(parse_eval, args, cfg, comm)) return 0;
  std::unique_ptr<Model> model;
  std::unique_ptr<io::Dataset> data;
  std::unique_ptr<kernels::Backend> backend;
  io::CheckpointMeta meta;
  agree(comm, [&] {
    const Device device = choose_device(cfg.device, comm);
    backend = make_backend(device, threads_for_rank(cfg.threads, comm), cfg.gpu_memory);
    meta = io::read_checkpoint_meta(cfg.checkpoint);
    data = std::make_unique<io::Dataset>(cfg.data);
    ModelSpec spec = ModelSpec::from_json(meta.model);
    RT_REQUIRE(spec.input == data->info().sample_shape, "--data '", cfg.data,
               "' has samples of shape ", shape_str(data->info().sample_shape), " but checkpoint '",
               cfg.checkpoint, "' holds a model for ", shape_str(spec.input));
    RT_REQUIRE(data->info().num_classes <= spec.classes, "--data '", cfg.data, "' has ",
               data->info().num_classes, " classes but the model predicts ", spec.classes);
    {
      DeviceScope on_device(device);
      model = build_model(spec, cfg.precision);
    }
    if (device.kind == Device::cpu) {
      io::read_checkpoint_params(cfg.checkpoint, master_views(*model));
      io::read_checkpoint_buffers(cfg.checkpoint, buffer_views(*model));
    } else {  // read into host copies, then upload
      HostMirror host(*model, nullptr);
      io::read_checkpoint_params(cfg.checkpoint, host.params);
      io::read_checkpoint_buffers(cfg.checkpoint, host.buffers);
      host.upload();
    }
    model->refresh_working_copy(*backend);
  });
  // Collective (the sums): an error in it ends the job from the rank that saw it.
  const EvalResult r = run_or_fail([&] {
    return evaluate(*model, *data, comm, *backend, cfg.batch_size, meta.input_mean, meta.input_std);
  });
  if (comm.rank() == 0) {
    std::printf("eval %s on %s (%lld samples, computed in %s): loss %.4f accuracy %.4f\n",
                cfg.checkpoint.c_str(), cfg.data.c_str(), static_cast<long long>(r.samples),
                dtype_name(cfg.precision), r.loss, r.accuracy);
    MetricsWriter metrics(cfg.metrics);
    metrics.write(JsonLine()
                      .add("type", "eval")
                      .add("step", meta.step)
                      .add("split", cfg.data)
                      .add("loss", r.loss)
                      .add("accuracy", r.accuracy));
  }
  return 0;
}

int cmd_convert(const std::vector<std::string>& args, comm::Communicator& comm) {
  const char* usage =
      "usage: ringtrain convert idx --images F --labels F --out PATH [--shards N]\n"
      "  idx   MNIST-style IDX files (.gz or plain) to a ringtrain dataset\n"
      "`ringtrain convert idx --help` lists its options.\n";
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    if (comm.rank() == 0) std::cout << usage;
    return 0;
  }
  std::vector<std::string> rest = args;
  agree(comm, [&] {
    RT_REQUIRE(!rest.empty() && rest[0] == "idx",
               "ringtrain convert: expected a source format: "
               "`ringtrain convert idx --images F --labels F --out PATH`",
               rest.empty() ? "" : cat(" (got '", rest[0], "')"));
  });
  rest.erase(rest.begin());
  ConvertConfig cfg;
  if (!parse_agreed(parse_convert, rest, cfg, comm)) return 0;
  agree(comm, [&] {  // one writer; the other ranks (if any) only wait for the outcome
    if (comm.rank() != 0) return;
    // Like `mkdir -p`: the README's first command writes data/train.h5 in a fresh directory.
    const std::filesystem::path parent = std::filesystem::path(cfg.out).parent_path();
    if (!parent.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(parent, ec);
      RT_REQUIRE(std::filesystem::is_directory(parent), "--out '", cfg.out, "': directory '",
                 parent.string(), "' cannot be created",
                 ec ? cat(" (", ec.message(), ")") : std::string());
    }
    auto r = io::convert_idx(cfg.images, cfg.labels, cfg.out, cfg.shards);
    const std::string where = r.files.size() == 1 ? r.files[0]
                                                  : cat(r.files.front(), " ... ", r.files.back(),
                                                        " (", r.files.size(), " shards)");
    std::printf("wrote %s: %lld samples of %s, %lld classes\n", where.c_str(),
                static_cast<long long>(r.samples), shape_str(r.sample_shape).c_str(),
                static_cast<long long>(r.num_classes));
  });
  return 0;
}

namespace {

std::string attr_value(hid_t obj, const char* name) {
  if (auto s = io::read_attr_string(obj, name)) return "\"" + *s + "\"";
  if (auto i = io::read_attr_int(obj, name)) return std::to_string(*i);
  if (auto d = io::read_attr_double(obj, name)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", *d);
    return buf;
  }
  return "(unprintable)";
}

herr_t print_attr(hid_t obj, const char* name, const H5A_info_t*, void* indent) {
  std::printf("%s@%s = %s\n", static_cast<const char*>(indent), name,
              attr_value(obj, name).c_str());
  return 0;
}

herr_t print_object(hid_t root, const char* name, const H5O_info_t* info, void*) {
  if (std::string(name) == ".") return 0;
  if (info->type == H5O_TYPE_GROUP) {
    std::printf("/%s/\n", name);
    io::H5Id g(H5Gopen2(root, name, H5P_DEFAULT));
    H5Aiterate2(g, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, print_attr, (void*)"    ");
  } else if (info->type == H5O_TYPE_DATASET) {
    io::H5Id ds = io::open_dataset(root, name);
    auto t = io::dataset_dtype(ds);
    io::H5Id dcpl(H5Dget_create_plist(ds));
    bool checksum = false;
    for (int i = 0, n = H5Pget_nfilters(dcpl); i < n; ++i) {
      unsigned flags = 0, cd[8];
      size_t ncd = 8;
      checksum |= H5Pget_filter2(dcpl, unsigned(i), &flags, &ncd, cd, 0, nullptr, nullptr) ==
                  H5Z_FILTER_FLETCHER32;
    }
    std::printf("/%s  %s %s%s\n", name, t ? dtype_name(*t) : "?",
                shape_str(io::dataset_shape(ds)).c_str(), checksum ? "  fletcher32" : "");
  }
  return 0;
}

}  // namespace

int cmd_inspect(const std::vector<std::string>& args, comm::Communicator& comm) {
  const char* usage =
      "usage: ringtrain inspect FILE.h5\n"
      "  prints what a dataset or checkpoint holds (attributes, datasets, dtypes, shapes);\n"
      "  for a checkpoint, also whether it is valid (exit 1 when it is not).\n";
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    if (comm.rank() == 0) std::cout << usage;
    return 0;
  }
  bool valid = true;
  agree(comm, [&] {
    RT_REQUIRE(args.size() == 1,
               "ringtrain inspect: expected one file (usage: ringtrain inspect FILE.h5)");
    if (comm.rank() != 0) return;
    std::error_code ec;  // a FIFO or device would block HDF5's open: refuse it first
    const auto st = std::filesystem::status(args[0], ec);
    RT_REQUIRE(!std::filesystem::exists(st) || std::filesystem::is_regular_file(st),
               "ringtrain inspect: '", args[0], "' is not a regular file; expected an HDF5 file");
    io::H5Id f = io::open_file_readonly(args[0], "file");
    auto format = io::read_attr_string(f, "format");
    std::printf("%s: %s, %llu bytes\n", args[0].c_str(),
                format ? format->c_str() : "(not a ringtrain file)",
                static_cast<unsigned long long>(std::filesystem::file_size(args[0])));
    H5Aiterate2(f, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, print_attr, (void*)"  ");
    H5_CHECK(H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_NATIVE, print_object, nullptr, H5O_INFO_BASIC));
    if (format && *format == io::kCheckpointFormat) {
      std::string why;
      valid = io::validate_checkpoint(args[0], &why);
      std::printf("valid: %s%s\n",
                  valid ? "yes (all checksums verified)" : "NO: ", valid ? "" : why.c_str());
    }
  });
  return valid ? 0 : 1;  // scripts can test a checkpoint with `ringtrain inspect FILE`
}

}  // namespace ringtrain::launch
