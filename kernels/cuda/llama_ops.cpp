// CudaBackend's Llama ops (kernels.hpp: rmsnorm, mul, rope_pack): what the CUDA kernels of
// llama.cu need beyond the shared checks (one dtype where they take one), scratch for the
// weight gradient's slices, then the launch; and the family's registration.
#include "core/error.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/launch.hpp"

namespace ringtrain::kernels::cuda {

void CudaBackend::do_rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps,
                                     const Tensor& y, const Tensor& rstd) {
  const int64_t rows = layernorm_rows(x, weight), c = weight.numel();
  launch_rmsnorm_fwd(x.data, x.dtype, weight.as<float>(), eps, y.data, y.dtype, rstd.as<float>(),
                     rows, c, stream());
}

void CudaBackend::do_rmsnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& weight,
                                      const Tensor& rstd, const Tensor& dx, const Tensor& dweight) {
  const int64_t rows = layernorm_rows(x, weight), c = weight.numel();
  RT_CHECK(dx.dtype == dy.dtype, "the CUDA rms norm gradient is written in dy's dtype ",
           dtype_name(dy.dtype), ", got dx ", dtype_name(dx.dtype));
  auto* partial = static_cast<float*>(scratch(kScratchA, size_t(kRmsNormSlices * c) * 4));
  launch_rmsnorm_bwd(x.data, x.dtype, dy.data, dx.data, dx.dtype, weight.as<float>(),
                     rstd.as<float>(), partial, dweight.as<float>(), rows, c, stream());
}

void CudaBackend::do_mul(const Tensor& a, const Tensor& b, const Tensor& y) {
  RT_CHECK(a.dtype == b.dtype, "the CUDA mul takes inputs of one dtype, got ", dtype_name(a.dtype),
           " and ", dtype_name(b.dtype));
  launch_mul(a.data, b.data, a.dtype, y.data, y.dtype, a.numel(), stream());
}

void CudaBackend::do_mul_backward(const Tensor& a, const Tensor& b, const Tensor& dy,
                                  const Tensor& da, const Tensor& db) {
  for (const Tensor* t : {&b, &dy, &da, &db})
    RT_CHECK(t->dtype == a.dtype, "the CUDA mul gradient takes tensors of one dtype, got ",
             dtype_name(a.dtype), " and ", dtype_name(t->dtype));
  launch_mul_bwd(a.data, b.data, dy.data, da.data, db.data, a.dtype, a.numel(), stream());
}

void CudaBackend::do_rope_pack(const RopeConfig& cfg, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& qkv) {
  const RopeDims d = rope_dims(cfg, q, k, v, qkv);
  RT_CHECK(k.dtype == q.dtype && v.dtype == q.dtype, "the CUDA rope_pack takes q, k, v of one ",
           "dtype, got ", dtype_name(q.dtype), ", ", dtype_name(k.dtype), ", ",
           dtype_name(v.dtype));
  launch_rope_pack(q.data, k.data, v.data, q.dtype, qkv.data, qkv.dtype, d.b * d.t, d.t, cfg.heads,
                   cfg.kv_heads, cfg.head_dim, cfg.theta, stream());
}

void CudaBackend::do_rope_pack_backward(const RopeConfig& cfg, const Tensor& dqkv, const Tensor& dq,
                                        const Tensor& dk, const Tensor& dv) {
  const RopeDims d = rope_dims(cfg, dq, dk, dv, dqkv);
  for (const Tensor* t : {&dq, &dk, &dv})
    RT_CHECK(t->dtype == dqkv.dtype, "the CUDA rope_pack gradient takes tensors of one dtype, got ",
             dtype_name(dqkv.dtype), " and ", dtype_name(t->dtype));
  launch_rope_pack_bwd(dqkv.data, dq.data, dk.data, dv.data, dqkv.dtype, d.b * d.t, d.t, cfg.heads,
                       cfg.kv_heads, cfg.head_dim, cfg.theta, stream());
}

RT_KERNEL_FAMILY(cuda, llama) {
  for (Op op : {Op::rmsnorm, Op::mul, Op::rope}) table.declare(op_name(op), kFloatDTypes);
}

}  // namespace ringtrain::kernels::cuda
