// The shared entry points of the Llama ops (kernels.hpp: rmsnorm, mul, rope_pack): shape,
// dtype and device checks made once for every backend before its kernel runs.
#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace ringtrain::kernels {

void Backend::rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                              const Tensor& rstd) {
  const int64_t rows = layernorm_rows(x, weight), c = weight.numel();
  RT_CHECK(y.numel() == x.numel() && rstd.numel() == rows && rstd.dtype == DType::f32 && eps > 0,
           "rms norm tensors do not match ", rows, " rows of ", c, " (eps ", eps, ")");
  require(Op::rmsnorm, x.dtype);
  for (const Tensor* t : {&x, &weight, &y, &rstd}) check_device(*t, "rms norm");
  do_rmsnorm_forward(x, weight, eps, y, rstd);
}

void Backend::rmsnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& weight,
                               const Tensor& rstd, const Tensor& dx, const Tensor& dweight) {
  const int64_t rows = layernorm_rows(x, weight), c = weight.numel();
  RT_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && dweight.numel() == c &&
               dweight.dtype == DType::f32 && rstd.numel() == rows,
           "rms norm gradient tensors do not match ", rows, " rows of ", c);
  require(Op::rmsnorm, x.dtype);
  for (const Tensor* t : {&x, &dy, &weight, &rstd, &dx, &dweight})
    check_device(*t, "rms norm gradient");
  do_rmsnorm_backward(x, dy, weight, rstd, dx, dweight);
}

void Backend::mul(const Tensor& a, const Tensor& b, const Tensor& y) {
  RT_CHECK(a.numel() == b.numel() && a.numel() == y.numel(), "mul of ", shape_str(a.shape), " and ",
           shape_str(b.shape), " into ", shape_str(y.shape));
  RT_CHECK(y.data != a.data && y.data != b.data, "mul's output may not alias an input");
  for (const Tensor* t : {&a, &b, &y}) require(Op::mul, t->dtype);
  for (const Tensor* t : {&a, &b, &y}) check_device(*t, "mul");
  do_mul(a, b, y);
}

void Backend::mul_backward(const Tensor& a, const Tensor& b, const Tensor& dy, const Tensor& da,
                           const Tensor& db) {
  const int64_t n = a.numel();
  RT_CHECK(b.numel() == n && dy.numel() == n && da.numel() == n && db.numel() == n,
           "mul gradient tensors differ in size: ", shape_str(a.shape), " ", shape_str(dy.shape));
  RT_CHECK(da.data != db.data && da.data != a.data && da.data != b.data && db.data != a.data &&
               db.data != b.data,
           "mul's gradients may not alias each other or an input");
  for (const Tensor* t : {&a, &b, &dy, &da, &db}) require(Op::mul, t->dtype);
  for (const Tensor* t : {&a, &b, &dy, &da, &db}) check_device(*t, "mul gradient");
  do_mul_backward(a, b, dy, da, db);
}

void Backend::rope_pack(const RopeConfig& cfg, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& qkv) {
  rope_dims(cfg, q, k, v, qkv);
  for (const Tensor* t : {&q, &k, &v, &qkv}) require(Op::rope, t->dtype);
  for (const Tensor* t : {&q, &k, &v, &qkv}) check_device(*t, "rope_pack");
  do_rope_pack(cfg, q, k, v, qkv);
}

void Backend::rope_pack_backward(const RopeConfig& cfg, const Tensor& dqkv, const Tensor& dq,
                                 const Tensor& dk, const Tensor& dv) {
  rope_dims(cfg, dq, dk, dv, dqkv);
  for (const Tensor* t : {&dqkv, &dq, &dk, &dv}) require(Op::rope, t->dtype);
  for (const Tensor* t : {&dqkv, &dq, &dk, &dv}) check_device(*t, "rope_pack gradient");
  do_rope_pack_backward(cfg, dqkv, dq, dk, dv);
}

}  // namespace ringtrain::kernels
