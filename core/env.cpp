// The table of RINGTRAIN_* environment settings and the one place that reads them (see
// env.hpp).
#include "core/env.hpp"

#include <unistd.h>  // environ

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/edit_distance.hpp"
#include "core/error.hpp"

namespace ringtrain::env {

const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = {
      {"RINGTRAIN_GEMM", "auto|onednn|openblas", "auto", "ringtrain",
       "the CPU GEMM: auto chooses oneDNN with AVX2 or better, else OpenBLAS",
       "architecture.md#cpu-gemm"},
      {"RINGTRAIN_CPU_BF16", "auto|native|widen", "auto", "ringtrain",
       "16-bit CPU GEMMs and convolutions on the 16-bit inputs (native) or widened to fp32; "
       "auto: native only with AMX-BF16",
       "architecture.md#cpu-gemm"},
      {"RINGTRAIN_CONV", "onednn|im2col", "onednn", "ringtrain",
       "the CPU convolution: oneDNN's, or im2col + OpenBLAS SGEMM per sample",
       "architecture.md#cpu-convolution"},
      {"RINGTRAIN_DIRECT_READ", "0|1", "1", "ringtrain",
       "0: read images through HDF5 hyperslabs instead of pread() of the chunks",
       "usage.md#data-loading"},
      {"RINGTRAIN_CHECKPOINT_DIRECT", "0|1", "1", "ringtrain",
       "0: write checkpoint chunks through HDF5's filter pipeline instead of pwritev() of each "
       "chunk and its Fletcher32",
       "formats.md#storage-and-integrity"},
      {"RINGTRAIN_RANKS_PER_NODE", "int k", "unset", "ringtrain",
       "treat each k consecutive ranks as one node, instead of the ranks that share memory",
       "usage.md#gradient-communication"},
      {"RINGTRAIN_VERBOSE", "0|1", "0", "ringtrain, launch/ringrun",
       "1: every rank prints its placement line (host, ranks, GPU, CPUs)",
       "launching.md#ringrun-rank-gpu-cpus-threads"},
      {"RINGTRAIN_CUDA_TF32", "0|1", "0", "ringtrain",
       "1: fp32 GEMMs and convolutions on the GPU in TF32", "gpu.md"},
      {"RINGTRAIN_CUDA_GEMM", "gemmex", "unset", "ringtrain",
       "gemmex: GPU GEMMs through cublasGemmEx instead of cuBLASLt", "gpu.md"},
      {"RINGTRAIN_CUDA_GEMM_WORKSPACE_MB", "int MiB", "32", "ringtrain",
       "the cuBLASLt workspace per GEMM", "gpu.md"},
      {"RINGTRAIN_CUDA_CONV_WORKSPACE_MB", "int MiB", "512", "ringtrain",
       "the most workspace a cuDNN convolution algorithm may use", "gpu.md"},
      {"RINGTRAIN_CUDA_ATTENTION", "auto|cudnn|kernel", "auto", "ringtrain",
       "the GPU's fp16/bf16 attention: cuDNN's fused attention (cudnn: required) or ringtrain's "
       "kernel; auto: cuDNN where built and the shape is supported. fp32 runs the kernel",
       "gpu.md#attention-cudnn-or-our-kernel"},
      {"RINGTRAIN_TEST_FAIL", "RANK:POINT[:STEP]", "unset", "ringtrain",
       "tests only: rank RANK throws a runtime error at POINT (read, forward, backward, reduce, "
       "gather, optimizer, eval, save, metrics, best, export), at step STEP or the first time",
       "restart.md"},
      {"RINGTRAIN_TEST_STALL", "RANK:STEP:SECONDS[:gather]", "unset", "ringtrain",
       "tests only: rank RANK sleeps SECONDS before step STEP, or before its all-gather under "
       "--zero 1",
       "usage.md#stall-detection"},
      {"RINGTRAIN_TEST_INJECT_NAN", "RANK:STEP:LAYER", "unset", "ringtrain",
       "tests only: rank RANK writes a nan into layer LAYER's output in step STEP (another "
       "form is ignored)",
       "usage.md#numerics"},
      {"RINGTRAIN_TEST_DIE_BEFORE_RENAME", "STEP", "unset", "ringtrain",
       "tests only: rank 0 exits (code 9) after writing step STEP's checkpoint to its .tmp "
       "file, before the rename",
       "restart.md"},
      {"RINGTRAIN_BIN", "path", "build/bin/ringtrain", "tests/e2e, tests/gpu, tools/demo.sh",
       "the ringtrain program the scripts run", ""},
      {"RINGTRAIN_HOME", "path", "$SLURM_SUBMIT_DIR", "slurm/train.sbatch",
       "the ringtrain checkout the batch script runs from", "../slurm/README.md"},
      {"RINGTRAIN_SLURM_DIR", "path", "/tmp/ringtrain-slurm", "slurm/local-cluster.sh, tests/slurm",
       "the directory of the local one-node Slurm", "../slurm/README.md"},
      {"RINGTRAIN_NETNS_PREFIX", "name", "rtnode", "tools/netns-cluster.sh",
       "the prefix of the network namespaces that stand for nodes", ""},
      {"RINGTRAIN_NETNS_SUBNET", "a.b.c", "10.77.0", "tools/netns-cluster.sh",
       "the /24 subnet of those namespaces", ""},
  };
  return table;
}

namespace {

const Setting* find(const std::string& name) {
  for (const auto& s : settings())
    if (name == s.name) return &s;
  return nullptr;
}

}  // namespace

const char* raw(const char* name) {
  RT_CHECK(find(name), "environment setting ", name, " is not declared in core/env.cpp");
  return std::getenv(name);
}

std::string value(const char* name) {
  if (const char* v = raw(name)) return v;
  const std::string d = find(name)->default_value;
  return d == "unset" ? "" : d;
}

std::vector<std::string> unknown_settings() {
  std::vector<std::string> names;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "RINGTRAIN_", 10) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    std::string name(*e, eq ? size_t(eq - *e) : std::strlen(*e));
    if (!find(name)) names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string unknown_settings_message(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) {
    std::string best;
    size_t best_d = 4;  // a typo is a few edits away
    for (const auto& s : settings())
      if (const size_t d = edit_distance(n, s.name); d < best_d) best_d = d, best = s.name;
    out += cat(out.empty() ? "" : "; ", n, " is not a ringtrain setting",
               best.empty() ? "" : cat(" (did you mean ", best, "?)"));
  }
  return out;
}

std::string markdown_table() {
  std::string out = "| variable | values | default | read by | meaning |\n|---|---|---|---|---|\n";
  auto cell = [](std::string s) {  // a | inside a cell would end it
    std::string r;
    for (char c : s) r += c == '|' ? std::string("\\|") : std::string(1, c);
    return r;
  };
  for (const auto& s : settings()) {
    const std::string see = *s.see ? cat(" ([more](", s.see, "))") : "";
    out += cat("| `", s.name, "` | `", cell(s.type), "` | ", s.default_value, " | ", s.read_by,
               " | ", cell(s.description), see, " |\n");
  }
  return out;
}

}  // namespace ringtrain::env
