// gpu_bench, report: the goals computed from the measured rows, their table, and the
// JSON file check.sh keeps (NaN, a goal not measured, is written as null).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include "benchmarks/gpu/bench_sections.hpp"

namespace ringtrain::gpubench {

void report(const Results& res, bool quick, bool gemm_only, const std::string& device,
            const std::string& cc, const std::string& libraries, const std::string& json_path) {
  const auto& gemm = res.gemm;
  const auto& bw = res.bw;
  const auto& train = res.train;
  const auto& gpt = res.gpt;
  const auto& errors = res.errors;
  // Goals of the issue, computed from the rows above; a goal whose rows are missing (a
  // --gemm-only run, a failed model) is not judged.
  auto gemm_row = [&](const std::string& name, const std::string& dt) -> const GemmRow* {
    for (const auto& r : gemm)
      if (r.name == name && r.dtype == dt) return &r;
    return nullptr;
  };
  auto train_row = [&](const std::string& model, const std::string& dt) -> const TrainRow* {
    for (const auto& r : train)
      if (r.model == model && r.dtype == dt) return &r;
    return nullptr;
  };
  double min_ratio = 1e9;
  for (const auto& r : gemm) min_ratio = std::min(min_ratio, r.ratio);
  const std::string sq = quick ? "square-4096" : "square-8192";
  const TrainRow* b32 = train_row("mlp-4096", "fp32");
  const TrainRow* b16 = train_row("mlp-4096", "bf16");
  const TrainRow* f16 = train_row("mlp-4096", "fp16");
  const double nan = std::nan("");
  const double bf16_vs_large =
      b16 && gemm_row(sq, "bf16") ? b16->model_tflops / gemm_row(sq, "bf16")->ours_tflops : nan;
  const double speedup_bf16 = b32 && b16 ? b32->step_ms / b16->step_ms : nan;
  const double speedup_fp16 = b32 && f16 ? b32->step_ms / f16->step_ms : nan;
  const GptRow* g32 = nullptr;
  const GptRow* g16 = nullptr;
  for (const auto& r : gpt) (r.dtype == "fp32" ? g32 : g16) = &r;
  const double gpt_mfu =
      g16 && gemm_row(sq, "bf16") ? g16->model_tflops / gemm_row(sq, "bf16")->ours_tflops : nan;
  const double gpt_speedup = g32 && g16 ? g16->tokens_per_s / g32->tokens_per_s : nan;
  double worst_opt_bw = bw.size() > 1 ? 1e9 : nan;
  for (const auto& r : bw)
    if (r.what == "unscale+check+AdamW") worst_opt_bw = std::min(worst_opt_bw, r.of_copy);
  struct Goal {
    const char* what;
    double value, target;
    bool at_least;
  };
  const Goal goals[] = {
      {"GEMM ours / direct cuBLAS (worst row)", min_ratio, 0.95, true},
      {"GEMM-bound bf16 model TFLOP/s / large bf16 GEMM", bf16_vs_large, 0.6, true},
      {"GEMM-bound fp32 step / bf16 step", speedup_bf16, 2.5, true},
      {"GEMM-bound fp32 step / fp16 step", speedup_fp16, 2.5, true},
      {"unscale+check+AdamW bandwidth / copy bandwidth (worst)", worst_opt_bw, 0.8, true},
      {"gpt2-124m bf16 model FLOP/s / large bf16 GEMM (MFU)", gpt_mfu, 0.5, true},
      {"gpt2-124m bf16 tokens/s / fp32 tokens/s", gpt_speedup, 3.0, true}};
  auto verdict = [](const Goal& g) {
    if (std::isnan(g.value)) return "not measured";
    return (g.at_least ? g.value >= g.target : g.value <= g.target) ? "met" : "MISSED";
  };
  std::printf("\n%-58s %10s %8s %s\n", "goal", "value", "target", "");
  for (const auto& g : goals)
    std::printf("%-58s %10.3f %s%-7.3g %s\n", g.what, g.value, g.at_least ? ">=" : "<=", g.target,
                verdict(g));
  if (b16)
    std::printf(
        "(optimizer share of the bf16 GEMM-bound step at batch %lld: %.1f %%, reported; "
        "its floor at copy bandwidth is 36 B/param against 6 x batch FLOP/param)\n",
        (long long)b16->batch, 100 * b16->opt_share);

  // JSON numbers: NaN (not measured) is written as null.
  auto num = [](double v) {
    std::ostringstream o;
    if (std::isnan(v) || std::isinf(v))
      o << "null";
    else
      o << v;
    return o.str();
  };
  std::ofstream js(json_path);
  js << "{\"device\":\"" << device << "\",\"cc\":\"" << cc << "\",\"libraries\":\"" << libraries
     << "\",\"quick\":" << (quick ? "true" : "false")
     << ",\"gemm_only\":" << (gemm_only ? "true" : "false") << ",\"gemm\":[";
  for (size_t i = 0; i < gemm.size(); ++i) {
    const auto& r = gemm[i];
    js << (i ? "," : "") << "{\"shape\":\"" << r.name << "\",\"dtype\":\"" << r.dtype
       << "\",\"m\":" << r.m << ",\"n\":" << r.n << ",\"k\":" << r.k
       << ",\"ours_tflops\":" << num(r.ours_tflops) << ",\"cublas_tflops\":" << num(r.ref_tflops)
       << ",\"ratio\":" << num(r.ratio) << ",\"max_rel_diff\":" << num(r.max_rel_diff) << "}";
  }
  js << "],\"bandwidth\":[";
  for (size_t i = 0; i < bw.size(); ++i) {
    const auto& r = bw[i];
    js << (i ? "," : "") << "{\"pass\":\"" << r.what << "\",\"dtype\":\"" << r.dtype
       << "\",\"bytes\":" << num(r.bytes) << ",\"ms\":" << num(r.seconds * 1e3)
       << ",\"gbps\":" << num(r.gbps) << ",\"of_copy\":" << num(r.of_copy) << "}";
  }
  js << "],\"train\":[";
  for (size_t i = 0; i < train.size(); ++i) {
    const auto& r = train[i];
    js << (i ? "," : "") << "{\"model\":\"" << r.model << "\",\"dtype\":\"" << r.dtype
       << "\",\"batch\":" << r.batch << ",\"params\":" << r.params
       << ",\"step_ms\":" << num(r.step_ms) << ",\"samples_per_sec\":" << num(r.samples_per_s)
       << ",\"opt_share\":" << num(r.opt_share) << ",\"model_tflops\":" << num(r.model_tflops)
       << "}";
  }
  js << "],\"gpt\":[";
  for (size_t i = 0; i < gpt.size(); ++i) {
    const auto& r = gpt[i];
    js << (i ? "," : "") << "{\"model\":\"gpt2-124m\",\"dtype\":\"" << r.dtype
       << "\",\"batch\":" << r.batch << ",\"seq\":" << r.seq << ",\"params\":" << r.params
       << ",\"step_ms\":" << num(r.step_ms) << ",\"tokens_per_sec\":" << num(r.tokens_per_s)
       << ",\"model_tflops\":" << num(r.model_tflops) << ",\"attention\":\"" << r.attention
       << "\"}";
  }
  js << "],\"gpt_ops\":[";
  for (size_t i = 0; i < res.gpt_ops.size(); ++i) {
    const auto& r = res.gpt_ops[i];
    js << (i ? "," : "") << "{\"op\":\"" << r.op << "\",\"dtype\":\"" << r.dtype
       << "\",\"ms\":" << num(r.ms) << ",\"calls_per_step\":" << num(r.calls_per_step)
       << ",\"ms_per_step\":" << num(r.ms_per_step) << ",\"rate\":" << num(r.rate) << ",\"unit\":\""
       << r.unit << "\",\"of_ref\":" << num(r.of_ref) << ",\"path\":\"" << r.path << "\"}";
  }
  js << "],\"goals\":[";
  for (size_t i = 0; i < std::size(goals); ++i) {
    const auto& g = goals[i];
    js << (i ? "," : "") << "{\"goal\":\"" << g.what << "\",\"value\":" << num(g.value)
       << ",\"target\":" << g.target << ",\"at_least\":" << (g.at_least ? "true" : "false")
       << ",\"verdict\":\"" << verdict(g) << "\"}";
  }
  js << "],\"errors\":[";
  for (size_t i = 0; i < errors.size(); ++i) {
    std::string e;
    for (char ch : errors[i]) e += ch == '"' || ch == '\\' ? '\'' : ch == '\n' ? ' ' : ch;
    js << (i ? "," : "") << "\"" << e << "\"";
  }
  js << "]}\n";
}

}  // namespace ringtrain::gpubench
