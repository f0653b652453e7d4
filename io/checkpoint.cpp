// Checkpoint read/validate and the directory store: listing, newest valid, pruning (see
// checkpoint.hpp). The collective writer is in checkpoint_writer.cpp.
#include "io/checkpoint.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "io/hdf5.hpp"

namespace fs = std::filesystem;

namespace ringtrain::io {

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  H5Lock lock;
  H5Id f = open_file_readonly(path, "checkpoint");
  const std::string what = cat("checkpoint '", path, "'");
  auto format = read_attr_string(f, "format");
  RT_REQUIRE(format && *format == kCheckpointFormat, what,
             " is not a ringtrain checkpoint: root "
             "attribute 'format' is ",
             format ? "'" + *format + "'" : std::string("missing"), "; expected '",
             kCheckpointFormat, "'");
  auto version = read_attr_int(f, "format_version");
  RT_REQUIRE(version && *version == kCheckpointVersion, what, " has format_version ",
             version ? std::to_string(*version) : "missing", "; this ringtrain reads version ",
             kCheckpointVersion);
  auto need_int = [&](hid_t obj, const char* name) {
    auto v = read_attr_int(obj, name);
    RT_REQUIRE(v, what, " lacks the integer attribute '", name, "'");
    return *v;
  };
  auto need_str = [&](hid_t obj, const char* name) {
    auto v = read_attr_string(obj, name);
    RT_REQUIRE(v, what, " lacks the string attribute '", name, "'");
    return *v;
  };
  auto need_double = [&](hid_t obj, const char* name) {
    auto v = read_attr_double(obj, name);
    RT_REQUIRE(v, what, " lacks the attribute '", name, "'");
    return *v;
  };
  CheckpointMeta m;
  m.step = need_int(f, "step");
  m.epoch = need_int(f, "epoch");
  m.samples_seen = need_int(f, "samples_seen");
  m.world_size = need_int(f, "world_size");
  m.global_batch = read_attr_int(f, "global_batch").value_or(0);
  m.precision = need_str(f, "precision");
  m.model = need_str(f, "model");
  m.ringtrain_version = need_str(f, "ringtrain_version");
  m.input_mean = need_double(f, "input_mean");
  m.input_std = need_double(f, "input_std");
  m.input_channel_mean = read_attr_doubles(f, "input_channel_mean").value_or(std::vector<double>{});
  m.input_channel_std = read_attr_doubles(f, "input_channel_std").value_or(std::vector<double>{});
  RT_REQUIRE(m.input_channel_mean.size() == m.input_channel_std.size(), what,
             ": input_channel_mean and input_channel_std differ in length");
  m.grad_accum = read_attr_int(f, "grad_accum").value_or(1);
  m.best_value = read_attr_double(f, "best_value").value_or(0);
  m.best_step = read_attr_int(f, "best_step").value_or(-1);
  m.evals_since_best = read_attr_int(f, "evals_since_best").value_or(0);
  for (const char* g : {"params", "optimizer", "loss_scaler", "data", "rng"})
    RT_REQUIRE(has_link(f, g), what, " lacks the group /", g);
  H5Id opt(H5_CHECK(H5Gopen2(f, "optimizer", H5P_DEFAULT)));
  m.optimizer = need_str(opt, "name");
  m.optimizer_step = need_int(opt, "step");
  H5Id ls(H5_CHECK(H5Gopen2(f, "loss_scaler", H5P_DEFAULT)));
  m.loss_scale = need_double(ls, "scale");
  m.growth_tracker = need_int(ls, "growth_tracker");
  H5Id data(H5_CHECK(H5Gopen2(f, "data", H5P_DEFAULT)));
  m.data_epoch = need_int(data, "epoch");
  m.data_position = need_int(data, "position");
  H5Id rng(H5_CHECK(H5Gopen2(f, "rng", H5P_DEFAULT)));
  m.seed = need_int(rng, "seed");
  return m;
}

void read_checkpoint_params(const std::string& path, const std::vector<NamedTensor>& params) {
  H5Lock lock;
  H5Id f = open_file_readonly(path, "checkpoint");
  for (const auto& p : params)
    read_dataset(f, "params/" + p.name, p.tensor, cat("checkpoint '", path, "'"));
}

void read_checkpoint_buffers(const std::string& path, const std::vector<NamedTensor>& buffers) {
  H5Lock lock;
  H5Id f = open_file_readonly(path, "checkpoint");
  for (const auto& b : buffers)
    read_dataset(f, "buffers/" + b.name, b.tensor, cat("checkpoint '", path, "'"));
}

void read_checkpoint_optimizer(const std::string& path, const std::vector<OptimizerState>& states) {
  H5Lock lock;
  H5Id f = open_file_readonly(path, "checkpoint");
  for (const auto& s : states)
    for (const auto& p : s.per_param)
      read_dataset(f, "optimizer/" + p.name + "/" + s.state, p.tensor,
                   cat("checkpoint '", path, "'"));
}

namespace {

// Visits every dataset below the root and reads it whole: HDF5 verifies the Fletcher32
// checksum of each chunk on the way.
herr_t read_all(hid_t loc, const char* name, const H5O_info_t* info, void* ok) {
  if (info->type != H5O_TYPE_DATASET) return 0;
  H5Id ds(H5Dopen2(loc, name, H5P_DEFAULT));
  if (ds.get() < 0) return -1;
  H5Id space(H5Dget_space(ds));
  H5Id type(H5Dget_type(ds));
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  std::vector<char> buf(size_t(std::max<hssize_t>(n, 1)) * H5Tget_size(type));
  if (n > 0 && H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0) {
    *static_cast<std::string*>(ok) =
        cat("dataset '", name, "' fails its checksum or cannot be read");
    return -1;
  }
  return 0;
}

}  // namespace

bool validate_checkpoint(const std::string& path, std::string* why,
                         const std::vector<NamedTensor>& expected) {
  H5Lock lock;
  try {
    read_checkpoint_meta(path);
    H5Id f = open_file_readonly(path, "checkpoint");
    for (const auto& p : expected) {
      RT_REQUIRE(has_link(f, p.name), "it has no dataset /", p.name);
      H5Id ds = open_dataset(f, p.name);
      RT_REQUIRE(dataset_dtype(ds) == DType::f32 && dataset_shape(ds) == p.tensor.shape, "/",
                 p.name, " is not fp32 ", shape_str(p.tensor.shape));
    }
    std::string problem;
    if (H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_NATIVE, read_all, &problem, H5O_INFO_BASIC) < 0) {
      if (why) *why = problem.empty() ? h5_error_stack() : problem;
      return false;
    }
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

CheckpointStore::CheckpointStore(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {
  RT_REQUIRE(keep >= 1, "--keep ", keep, " is not valid; keep at least 1 checkpoint");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  RT_REQUIRE(!ec && fs::is_directory(dir_), "--checkpoint-dir '", dir_,
             "' cannot be created or is not a directory", ec ? ": " + ec.message() : "");
}

std::string CheckpointStore::path_for(int64_t step) const {
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%09lld.h5", static_cast<long long>(step));
  return (fs::path(dir_) / name).string();
}

std::vector<std::string> CheckpointStore::list() const {
  static const std::regex name_re(R"(ckpt-(\d{9})\.h5)");
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && std::regex_match(name, name_re)) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());  // 9-digit steps sort by name
  return out;
}

std::optional<std::string> CheckpointStore::latest_valid(
    std::vector<std::pair<std::string, std::string>>* skipped,
    const std::vector<NamedTensor>& expected,
    const std::function<void(const std::string&, const CheckpointMeta&)>& same_run) const {
  auto files = list();
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    std::string why;
    std::optional<CheckpointMeta> m;
    try {
      m = read_checkpoint_meta(*it);
    } catch (const Error& e) {
      why = e.what();
    }
    if (m) {
      if (same_run) same_run(*it, *m);  // an intact file of another run: its error propagates
      if (validate_checkpoint(*it, &why, expected)) return *it;
    }
    if (skipped) skipped->push_back({*it, why});
  }
  return std::nullopt;
}

void CheckpointStore::prune(const std::string& keep_this) {
  auto files = list();
  files.erase(std::remove(files.begin(), files.end(), keep_this), files.end());
  // The file just written always stays, plus the newest keep-1 of the others.
  for (size_t i = 0; i + size_t(keep_ - 1) < files.size(); ++i) {
    std::error_code ec;
    fs::remove(files[i], ec);
  }
  // A .tmp left by a killed save is never a checkpoint; remove stale ones too.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (e.path().extension() == ".tmp" && e.path().stem().extension() == ".h5")
      fs::remove(e.path(), ec);
}

}  // namespace ringtrain::io
