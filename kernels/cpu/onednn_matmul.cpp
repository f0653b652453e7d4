// oneDNN matmul with a per-shape primitive cache (see onednn_matmul.hpp). The cache is
// guarded by a mutex and each thread executes on its own stream with its own scratch memory,
// so that the attention kernel's threads can share one OneDnnMatmul.
#include "kernels/cpu/onednn_matmul.hpp"

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/onednn_util.hpp"

namespace ringtrain::kernels::cpu {

namespace {

using dnnl::memory;
using dt = memory::data_type;

const char* isa_str(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      break;
  }
  return "other";
}

// trans_a, trans_b, m, n, k, in, out, alpha, beta, bias
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, DType, DType, float, float, bool>;

// One CPU engine for the process, created on first use and never destroyed.
dnnl::engine& cpu_engine() {
  static auto* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

}  // namespace

struct OneDnnMatmul::Impl {
  dnnl::engine& eng = cpu_engine();
  struct Entry {
    dnnl::matmul prim;
    memory::desc a, b, c, bias, scratch;
  };
  std::map<Key, Entry> cache;
  std::map<std::pair<DType, DType>, std::string> probed;  // (in, out) -> implementation

  dnnl::matmul::primitive_desc make_pd(const memory::desc& a, const memory::desc& b,
                                       const memory::desc& c, float alpha, float beta,
                                       const memory::desc* bias = nullptr) {
    dnnl::primitive_attr attr;
    // Scratch memory passed per call from the calling thread (concurrent calls never share it).
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.f) attr.set_output_scales(0, {alpha});
    if (beta != 0.f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    if (bias) return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, *bias, c), attr, eng);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, eng);
  }

  std::mutex mu;  // guards cache

  // Row-major x[rows, cols] as oneDNN sees op(x): transposition is a swap of the strides.
  static memory::desc desc(int64_t rows, int64_t cols, bool trans, DType t) {
    const memory::dims dims{rows, cols};
    const memory::dims strides = trans ? memory::dims{1, rows} : memory::dims{cols, 1};
    return memory::desc(dims, dnnl_type(t, "oneDNN matmul"), strides);
  }

  Entry& get(const Key& key) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    const auto& [ta, tb, m, n, k, in, out, alpha, beta, has_bias] = key;
    Entry e;
    e.a = desc(m, k, ta, in);
    e.b = desc(k, n, tb, in);
    e.c = desc(m, n, false, out);
    if (has_bias) e.bias = desc(1, n, false, DType::f32);
    const auto pd = make_pd(e.a, e.b, e.c, alpha, beta, has_bias ? &e.bias : nullptr);
    e.scratch = pd.scratchpad_desc();
    e.prim = dnnl::matmul(pd);
    return cache.emplace(key, std::move(e)).first->second;  // std::map: references stay valid
  }

  // The calling thread's stream on the process's CPU engine (a stream is not shared between
  // threads; the engine outlives every stream).
  static dnnl::stream& thread_stream() {
    thread_local dnnl::stream s{cpu_engine()};
    return s;
  }

  // The calling thread's scratch memory, grown to at least `bytes` (64-byte aligned).
  static void* thread_scratch(size_t bytes) {
    thread_local std::vector<char> buf;
    if (buf.size() < bytes + 64) buf.resize(bytes + 64);
    const auto p = reinterpret_cast<uintptr_t>(buf.data());
    return buf.data() + ((64 - p % 64) % 64);
  }

  std::string probe(DType in, DType out) {
    auto it = probed.find({in, out});
    if (it != probed.end()) return it->second;
    std::string impl = "none";
    try {
      // A model-like shape: oneDNN may pick different kernels for tiny ones.
      impl = make_pd(desc(64, 256, false, in), desc(256, 256, true, in), desc(64, 256, false, out),
                     1.f, 0.f)
                 .impl_info_str();
    } catch (const dnnl::error&) {  // unimplemented for these dtypes on this CPU
    }
    return probed.emplace(std::make_pair(in, out), impl).first->second;
  }
};

OneDnnMatmul::OneDnnMatmul() : impl_(std::make_unique<Impl>()) {}
OneDnnMatmul::~OneDnnMatmul() = default;

std::string OneDnnMatmul::impl_name(DType in, DType out) { return impl_->probe(in, out); }

bool OneDnnMatmul::supports(DType in, DType out) {
  if (!is_float(in) || !is_float(out)) return false;
  const std::string impl = impl_->probe(in, out);
  return impl != "none" && !is_reference_impl(impl);
}

void OneDnnMatmul::run(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const void* a, const void* b, DType in, float beta, void* c, DType out,
                       const float* bias) {
  auto& im = *impl_;
  auto& e = im.get({trans_a, trans_b, m, n, k, in, out, alpha, beta, bias != nullptr});
  memory ma(e.a, im.eng, const_cast<void*>(a)), mb(e.b, im.eng, const_cast<void*>(b)),
      mc(e.c, im.eng, c), ms(e.scratch, im.eng, im.thread_scratch(e.scratch.get_size()));
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_SCRATCHPAD, ms}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(e.bias, im.eng, const_cast<float*>(bias)));
  dnnl::stream& strm = im.thread_stream();
  e.prim.execute(strm, args);
  strm.wait();
}

std::string onednn_description() {
  const dnnl_version_t* v = dnnl_version();
  return cat("oneDNN ", v->major, ".", v->minor, ".", v->patch, " isa ",
             isa_str(dnnl::get_effective_cpu_isa()));
}

}  // namespace ringtrain::kernels::cpu
