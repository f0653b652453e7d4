// oneDNN matmul with a per-shape primitive cache (see onednn_matmul.hpp).
#include "kernels/cpu/onednn_matmul.hpp"

#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

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

using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, DType, DType, float, float>;

}  // namespace

struct OneDnnMatmul::Impl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  struct Entry {
    dnnl::matmul prim;
    memory::desc a, b, c;
  };
  std::map<Key, Entry> cache;
  std::map<std::pair<DType, DType>, std::string> probed;  // (in, out) -> implementation

  // Row-major x[rows, cols] as oneDNN sees op(x): transposition is a swap of the strides.
  static memory::desc desc(int64_t rows, int64_t cols, bool trans, DType t) {
    const memory::dims dims{rows, cols};
    const memory::dims strides = trans ? memory::dims{1, rows} : memory::dims{cols, 1};
    return memory::desc(dims, dnnl_type(t, "oneDNN matmul"), strides);
  }

  dnnl::matmul::primitive_desc make_pd(const memory::desc& a, const memory::desc& b,
                                       const memory::desc& c, float alpha, float beta) {
    dnnl::primitive_attr attr;
    if (alpha != 1.f) attr.set_output_scales(0, {alpha});
    if (beta != 0.f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, eng);
  }

  Entry& get(const Key& key) {
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    const auto& [ta, tb, m, n, k, in, out, alpha, beta] = key;
    Entry e;
    e.a = desc(m, k, ta, in);
    e.b = desc(k, n, tb, in);
    e.c = desc(m, n, false, out);
    e.prim = dnnl::matmul(make_pd(e.a, e.b, e.c, alpha, beta));
    return cache.emplace(key, std::move(e)).first->second;
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
                       const void* a, const void* b, DType in, float beta, void* c, DType out) {
  auto& im = *impl_;
  auto& e = im.get({trans_a, trans_b, m, n, k, in, out, alpha, beta});
  memory ma(e.a, im.eng, const_cast<void*>(a)), mb(e.b, im.eng, const_cast<void*>(b)),
      mc(e.c, im.eng, c);
  e.prim.execute(im.strm, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
  im.strm.wait();
}

std::string onednn_description() {
  const dnnl_version_t* v = dnnl_version();
  return cat("oneDNN ", v->major, ".", v->minor, ".", v->patch, " isa ",
             isa_str(dnnl::get_effective_cpu_isa()));
}

}  // namespace ringtrain::kernels::cpu
