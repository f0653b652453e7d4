// The kernel table answers truthfully (kernels/kernel_table.hpp): on the CPU backend every op
// is called on tiny zero tensors of every dtype; a declared (op, dtype) must run, an undeclared
// one must be refused by the shared entry point with an internal error, and every op the table
// declares must have a call here (so a new family cannot go untested). Also: a second
// registration of one kernel is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "core/error.hpp"
#include "kernels/forwarding_backend.hpp"
#include "kernels/kernels.hpp"
#include "test_util.hpp"

namespace ringtrain::test {
namespace {

using namespace kernels;

// Zeroed tensors that live as long as the pool.
class Pool {
 public:
  Tensor make(Shape shape, DType t) {
    buffers_.emplace_back(std::max<size_t>(size_t(shape_numel(shape)) * dtype_size(t), 1));
    std::memset(buffers_.back().data(), 0, buffers_.back().bytes());
    return Tensor(buffers_.back().data(), std::move(shape), t);
  }

 private:
  std::vector<Buffer> buffers_;
};

using OpCall = std::function<void(Backend&, Pool&, DType)>;

// One call of each op with its main tensor (the one supports() is asked about) in dtype t and
// the others in the dtypes the op's contract fixes.
const std::map<std::string, OpCall>& op_calls() {
  constexpr DType f32 = DType::f32, i32 = DType::i32, u8 = DType::u8;
  static const std::map<std::string, OpCall> calls = {
      {"gemm",
       [](Backend& be, Pool& p, DType t) {
         be.gemm(false, false, 1.f, p.make({2, 3}, t), p.make({3, 4}, t), 0.f, p.make({2, 4}, t));
       }},
      {"cast", [](Backend& be, Pool& p, DType t) { be.cast(p.make({5}, t), p.make({5}, t)); }},
      {"bias_add",
       [](Backend& be, Pool& p, DType t) {
         be.bias_add(p.make({2, 3}, t), p.make({3}, f32), Activation::relu);
       }},
      {"bias_grad",
       [](Backend& be, Pool& p, DType t) {
         be.bias_grad(p.make({2, 3}, t), p.make({3}, f32));
       }},
      {"relu", [](Backend& be, Pool& p, DType t) { be.relu(p.make({5}, t), p.make({5}, t)); }},
      {"relu_backward",
       [](Backend& be, Pool& p, DType t) {
         be.relu_backward(p.make({5}, t), p.make({5}, t), p.make({5}, t));
       }},
      {"softmax_xent",
       [](Backend& be, Pool& p, DType t) {
         Tensor dl = p.make({2, 3}, t);
         be.softmax_xent(p.make({2, 3}, t), p.make({2}, i32), 1.f, &dl);
       }},
      {"unscale_check", [](Backend& be, Pool& p,
                           DType t) { be.unscale_check(p.make({5}, t), 1.f, p.make({5}, f32)); }},
      {"fused_unscale",  // the read-only check, and an optimizer step on a scaled gradient
       [](Backend& be, Pool& p, DType t) {
         be.unscale_check(p.make({5}, t), 0.5f, Tensor(nullptr, {5}, f32));
         SgdConfig cfg;
         cfg.grad_scale = 0.5f;
         be.sgd_step(cfg, p.make({5}, f32), p.make({5}, t), nullptr, nullptr);
       }},
      {"any_nonfinite", [](Backend& be, Pool& p, DType t) { be.any_nonfinite(p.make({5}, t)); }},
      {"sum_squares", [](Backend& be, Pool& p, DType t) { be.sum_squares(p.make({5}, t)); }},
      {"scale", [](Backend& be, Pool& p, DType t) { be.scale(p.make({5}, t), 2.f); }},
      {"sgd_step",
       [](Backend& be, Pool& p, DType t) {
         Tensor m = p.make({5}, f32);
         be.sgd_step(SgdConfig{}, p.make({5}, t), p.make({5}, f32), &m, nullptr);
       }},
      {"adamw_step",
       [](Backend& be, Pool& p, DType t) {
         be.adamw_step(AdamWConfig{}, p.make({5}, t), p.make({5}, f32), p.make({5}, f32),
                       p.make({5}, f32), nullptr);
       }},
      {"conv2d",
       [](Backend& be, Pool& p, DType t) {
         ConvShape cs;
         cs.n = 1, cs.c = 2, cs.h = 4, cs.w = 4, cs.k = 3, cs.r = 3, cs.s = 3, cs.pad = 1;
         const Tensor x = p.make({1, 2, 4, 4}, t), w = p.make({3, 2, 3, 3}, t);
         const Tensor y = p.make({1, 3, 4, 4}, t), dx = p.make({1, 2, 4, 4}, t);
         const Tensor dw = p.make({3, 2, 3, 3}, t), db = p.make({3}, f32);
         be.conv2d_forward(cs, x, w, nullptr, Activation::none, y);
         be.conv2d_backward(cs, x, y, w, &dx, dw, &db);
       }},
      {"maxpool2d",
       [](Backend& be, Pool& p, DType t) {
         PoolShape ps;
         ps.n = 1, ps.c = 2, ps.h = 4, ps.w = 4;
         const Tensor x = p.make({1, 2, 4, 4}, t), y = p.make({1, 2, 2, 2}, t);
         const Tensor am = p.make({1, 2, 2, 2}, i32);
         be.maxpool2d_forward(ps, x, y, am);
         be.maxpool2d_backward(ps, y, am, x);
       }},
      {"avgpool_global",
       [](Backend& be, Pool& p, DType t) {
         const Tensor x = p.make({1, 2, 3, 3}, t), y = p.make({1, 2}, t);
         be.avgpool_global_forward(x, y);
         be.avgpool_global_backward(y, x);
       }},
      {"batchnorm",
       [](Backend& be, Pool& p, DType t) {
         const Tensor x = p.make({2, 3, 2, 2}, t), y = p.make({2, 3, 2, 2}, t);
         auto c = [&] { return p.make({3}, f32); };
         const Tensor g = c(), b = c(), rm = c(), rv = c(), mean = c(), invstd = c();
         be.batchnorm_forward(BatchNormConfig{}, true, x, g, b, rm, rv, y, mean, invstd);
         be.batchnorm_backward(true, x, y, g, mean, invstd, p.make({2, 3, 2, 2}, t), c(), c());
       }},
      {"dropout",
       [](Backend& be, Pool& p, DType t) {
         const Tensor x = p.make({5}, t), y = p.make({5}, t), mask = p.make({5}, u8);
         be.dropout_forward(x, 0.5f, 1, y, mask);
         be.dropout_backward(y, mask, 0.5f, x);
       }},
      {"add", [](Backend& be, Pool& p,
                 DType t) { be.add(p.make({5}, t), p.make({5}, t), p.make({5}, t)); }},
      {"embedding",
       [](Backend& be, Pool& p, DType t) {
         const Tensor tokens = p.make({1, 2}, i32), wte = p.make({4, 3}, t);
         const Tensor wpe = p.make({2, 3}, t), y = p.make({1, 2, 3}, t);
         be.embedding_forward(tokens, wte, &wpe, y);
         const Tensor dwpe = p.make({2, 3}, f32);
         be.embedding_backward(tokens, y, p.make({4, 3}, f32), &dwpe);
       }},
      {"layernorm",
       [](Backend& be, Pool& p, DType t) {
         const Tensor x = p.make({2, 3}, t), y = p.make({2, 3}, t);
         const Tensor g = p.make({3}, f32), b = p.make({3}, f32);
         const Tensor mean = p.make({2}, f32), rstd = p.make({2}, f32);
         be.layernorm_forward(x, g, b, 1e-5f, y, mean, rstd);
         be.layernorm_backward(x, y, g, mean, rstd, p.make({2, 3}, t), p.make({3}, f32),
                               p.make({3}, f32));
       }},
      {"rmsnorm",
       [](Backend& be, Pool& p, DType t) {
         const Tensor x = p.make({2, 3}, t), y = p.make({2, 3}, t);
         const Tensor g = p.make({3}, f32), rstd = p.make({2}, f32);
         be.rmsnorm_forward(x, g, 1e-5f, y, rstd);
         be.rmsnorm_backward(x, y, g, rstd, p.make({2, 3}, t), p.make({3}, f32));
       }},
      {"mul",
       [](Backend& be, Pool& p, DType t) {
         const Tensor a = p.make({5}, t), b = p.make({5}, t), y = p.make({5}, t);
         be.mul(a, b, y);
         be.mul_backward(a, b, y, p.make({5}, t), p.make({5}, t));
       }},
      {"rope",
       [](Backend& be, Pool& p, DType t) {
         const RopeConfig cfg{2, 1, 2, 10000.0};
         const Tensor q = p.make({1, 2, 4}, t), k = p.make({1, 2, 2}, t), v = p.make({1, 2, 2}, t);
         const Tensor qkv = p.make({1, 2, 12}, t);
         be.rope_pack(cfg, q, k, v, qkv);
         be.rope_pack_backward(cfg, qkv, p.make({1, 2, 4}, t), p.make({1, 2, 2}, t),
                               p.make({1, 2, 2}, t));
       }},
      {"attention",
       [](Backend& be, Pool& p, DType t) {
         const Tensor qkv = p.make({1, 2, 6}, t), out = p.make({1, 2, 2}, t);
         const Tensor lse = p.make({1, 1, 2}, f32);
         be.attention_forward(1, qkv, out, lse);
         be.attention_backward(1, qkv, out, out, lse, p.make({1, 2, 6}, t));
       }},
      {"token_xent",
       [](Backend& be, Pool& p, DType t) {
         const Tensor logits = p.make({2, 4}, t);
         be.token_xent(logits, p.make({2}, i32), 3, 1.f, &logits);
       }},
      {"pointwise_loss",
       [](Backend& be, Pool& p, DType t) {
         const Tensor pred = p.make({2, 3}, t), d = p.make({2, 3}, t);
         be.pointwise_loss(PointwiseLoss::mse, pred, p.make({2, 3}, t), 1.f, nullptr, 1.f, &d);
       }},
      {"pixel_xent",
       [](Backend& be, Pool& p, DType t) {
         const Tensor logits = p.make({2, 3, 4}, t), d = p.make({2, 3, 4}, t);
         be.pixel_xent(logits, p.make({2, 4}, i32), -100, 1.f, &d);
       }},
  };
  return calls;
}

constexpr DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::i32,
                                DType::i64, DType::u8,  DType::f64};

// Runs `call` for `op` in dtype t; true when it returned, false when it threw Error.
bool runs(Backend& be, const OpCall& call, DType t, std::string* what) {
  Pool pool;
  try {
    call(be, pool, t);
    return true;
  } catch (const Error& e) {
    *what = e.what();
    return false;
  }
}

TEST(KernelTable, CpuDeclaredKernelsRunAndUndeclaredAreRefused) {
  auto be = make_cpu_backend(1);
  const KernelTable& table = be->kernel_table();
  std::set<std::string> ops;
  for (const auto& [op, t] : table.entries()) ops.insert(op);
  for (const auto& [op, call] : op_calls()) ops.insert(op);
  int declared = 0;
  const std::vector<std::string> unary_ops = table.unary_ops();
  for (const std::string& op : ops) {
    const bool unary = std::find(unary_ops.begin(), unary_ops.end(), op) != unary_ops.end();
    auto it = op_calls().find(op);
    ASSERT_TRUE(unary || it != op_calls().end())
        << "the cpu backend declares '" << op << "' but this test has no call for it";
    const OpCall call = unary ? OpCall([op](Backend& b, Pool& p, DType t) {
      const Tensor x = p.make({7}, t), y = p.make({7}, t);
      b.unary(op, x, y);
      b.unary_backward(op, x, y, p.make({7}, t));
    })
                              : it->second;
    for (DType t : kAllDTypes) {
      std::string what;
      const bool ok = runs(*be, call, t, &what);
      if (be->supports(op, t)) {
        ++declared;
        EXPECT_TRUE(ok) << "cpu declares " << op << " for " << dtype_name(t)
                        << " but the call threw: " << what;
      } else {
        EXPECT_FALSE(ok) << "cpu does not declare " << op << " for " << dtype_name(t)
                         << " but the call ran";
      }
    }
  }
  EXPECT_GE(declared, 50);  // every op at least in fp32
  // Each enum value is a table op or named here.
  for (int i = 0; i <= int(Op::fused_unscale); ++i)
    EXPECT_TRUE(ops.count(op_name(Op(i)))) << op_name(Op(i));
}

// A backend wrapped in a ForwardingBackend answers and runs as the backend itself.
TEST(KernelTable, ForwardingBackendRunsTheInnerTable) {
  auto cpu = make_cpu_backend(1);
  ForwardingBackend fwd(*cpu);
  EXPECT_EQ(&fwd.kernel_table(), &cpu->kernel_table());
  EXPECT_TRUE(fwd.supports(Op::gelu, DType::bf16));
  EXPECT_FALSE(fwd.supports(Op::gelu, DType::i32));
  Pool p;
  const Tensor x = p.make({3}, DType::f32), y = p.make({3}, DType::f32);
  x.as<float>()[0] = 1.f;
  fwd.gelu(x, y);
  EXPECT_NEAR(y.as<float>()[0], 0.8413447f, 1e-6);
}

TEST(KernelTable, DoubleRegistrationIsRefused) {
  KernelTable t;
  t.declare("gemm", {DType::f32});
  EXPECT_TRUE(throws_kind(
      [&] {
        t.declare("gemm", {DType::bf16, DType::f32});
      },
      ErrorKind::runtime));
  EXPECT_TRUE(t.has("gemm", DType::f32));
  EXPECT_FALSE(t.has("gemm", DType::f16));
  EXPECT_EQ(t.find_unary("gemm", DType::f32), nullptr);
}

}  // namespace
}  // namespace ringtrain::test
