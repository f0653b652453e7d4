// The activation family of the kernel table (kernels/cpu/cpu_activation.cpp) against PyTorch,
// computed at test time: this test writes its inputs, /usr/bin/python3 (Debian's
// python3-torch, tools/install-deps.sh) evaluates the forward pass and the autograd gradient
// in float64 on exactly those values, and the CPU backend's fp32, bf16 and fp16 results must
// agree within the dtype's rounding. One row per activation in kActivations: a new
// activation adds its row (its kernel name and the PyTorch expression).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "test_util.hpp"

namespace ringtrain::test {
namespace {

struct Activation {
  const char* kernel;  // the kernel table's name
  const char* torch;   // PyTorch's form of it, of a float64 tensor x
};

const Activation kActivations[] = {
    {"gelu", "torch.nn.functional.gelu(x)"},
    {"gelu_tanh", "torch.nn.functional.gelu(x, approximate='tanh')"},
};

// argv: input file (float32 x then dy, n each), output file (float64 y then dx), expression.
constexpr const char* kScript = R"(
import sys, numpy as np, torch
n = int(sys.argv[3])
v = np.fromfile(sys.argv[1], dtype=np.float32).astype(np.float64)
x = torch.tensor(v[:n], requires_grad=True)
dy = torch.tensor(v[n:])
y = eval(sys.argv[4])
y.backward(dy)
np.concatenate([y.detach().numpy(), x.grad.numpy()]).astype(np.float64).tofile(sys.argv[2])
)";

// y and dx of `expr` by PyTorch on x and dy (float64 results).
void torch_reference(const std::string& expr, const std::vector<float>& x,
                     const std::vector<float>& dy, std::vector<double>& y,
                     std::vector<double>& dx) {
  const std::string dir = ::testing::TempDir();
  const std::string script = dir + "rt_activation_ref.py", in = dir + "rt_activation_in.bin",
                    out = dir + "rt_activation_out.bin";
  std::ofstream(script) << kScript;
  {
    std::ofstream f(in, std::ios::binary);
    f.write(reinterpret_cast<const char*>(x.data()), std::streamsize(x.size() * 4));
    f.write(reinterpret_cast<const char*>(dy.data()), std::streamsize(dy.size() * 4));
  }
  const std::string cmd = "OMP_NUM_THREADS=1 /usr/bin/python3 " + script + " " + in + " " + out +
                          " " + std::to_string(x.size()) + " \"" + expr + "\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<double> r(2 * x.size());
  std::ifstream f(out, std::ios::binary);
  f.read(reinterpret_cast<char*>(r.data()), std::streamsize(r.size() * 8));
  ASSERT_TRUE(f) << "short output from " << cmd;
  y.assign(r.begin(), r.begin() + std::ptrdiff_t(x.size()));
  dx.assign(r.begin() + std::ptrdiff_t(x.size()), r.end());
}

// x and dy rounded through `t` and back (what a tensor of dtype t holds).
std::vector<float> through(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> raw(v.size() * dtype_size(t));
  kernels::host_from_f32(v.data(), raw.data(), t, int64_t(v.size()));
  std::vector<float> back(v.size());
  kernels::host_to_f32(raw.data(), t, back.data(), int64_t(v.size()));
  return back;
}

class ActivationTorch : public ::testing::TestWithParam<DType> {};

TEST_P(ActivationTorch, ForwardAndBackwardMatchPyTorch) {
  const DType t = GetParam();
  const size_t n = 4001;  // [-10, 10] in steps of 1/200 (0 included), then random points
  std::vector<float> x0(n), dy0 = uniform_floats(n, -2.f, 2.f, 7);
  for (size_t i = 0; i < n; ++i) x0[i] = -10.f + 20.f * float(i) / float(n - 1);
  const auto extra = uniform_floats(200, -30.f, 30.f, 11);
  x0.insert(x0.end(), extra.begin(), extra.end());
  dy0.resize(x0.size(), 0.5f);
  const std::vector<float> x = through(x0, t), dy = through(dy0, t);
  const int64_t m = int64_t(x.size());
  // Tolerance: fp32 within PyTorch's own parity bound; 16 bits: one rounding of the result
  // (half a unit in the last place) plus the fp32 arithmetic before it.
  const double rtol = t == DType::f32 ? 1e-5 : t == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
  const double atol = t == DType::f32 ? 1e-6 : 1e-5;
  auto be = kernels::make_cpu_backend(2);
  for (const Activation& a : kActivations) {
    SCOPED_TRACE(a.kernel);
    ASSERT_TRUE(be->supports(a.kernel, t));
    std::vector<double> ry, rdx;
    torch_reference(a.torch, x, dy, ry, rdx);
    ASSERT_EQ(ry.size(), x.size());
    std::vector<uint8_t> bx(size_t(m) * dtype_size(t)), bdy(bx.size()), by(bx.size()),
        bdx(bx.size());
    kernels::host_from_f32(x.data(), bx.data(), t, m);
    kernels::host_from_f32(dy.data(), bdy.data(), t, m);
    const Tensor tx(bx.data(), {m}, t), tdy(bdy.data(), {m}, t), ty(by.data(), {m}, t),
        tdx(bdx.data(), {m}, t);
    be->unary(a.kernel, tx, ty);
    be->unary_backward(a.kernel, tx, tdy, tdx);
    std::vector<float> y(static_cast<size_t>(m)), dx(static_cast<size_t>(m));
    kernels::host_to_f32(by.data(), t, y.data(), m);
    kernels::host_to_f32(bdx.data(), t, dx.data(), m);
    int bad = 0;
    for (size_t i = 0; i < size_t(m) && bad < 5; ++i) {
      if (!close(y[i], ry[i], rtol, atol)) {
        ++bad;
        ADD_FAILURE() << "forward at index " << i << " x " << x[i] << ": got " << y[i]
                      << ", PyTorch " << ry[i];
      }
      if (!close(dx[i], rdx[i], rtol, atol)) {
        ++bad;
        ADD_FAILURE() << "backward at index " << i << " x " << x[i] << " dy " << dy[i]
                      << ": got " << dx[i] << ", PyTorch " << rdx[i];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ActivationTorch,
                         ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace ringtrain::test
