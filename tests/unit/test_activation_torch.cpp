// Every activation against PyTorch, computed at test time: this test writes its inputs,
// /usr/bin/python3 (Debian's python3-torch, tools/install-deps.sh) evaluates the forward pass
// and the autograd gradient in float64 on exactly those values, and ringtrain must agree:
//   - every pointwise kernel of the CPU backend's kernel table (kernels/cpu/cpu_activation.cpp)
//     in fp32, bf16 and fp16, within the dtype's rounding;
//   - every activation kind a model file names (`activation { kind: K }`, model.proto's enum
//     Activation): the layer the activation op builds from that text, forward and backward in
//     fp32, and its ONNX form (the nodes its export hook writes, evaluated op by op in
//     PyTorch) within fp32 rounding.
// Both lists come from the code (the table, the enum), so a new activation is tested without
// a line here: its PyTorch form is torch.nn.functional.<name> (the kernel's name, the kind's
// in lower case) unless kTorchForms says otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include <cctype>
#include <map>

#include "kernels/kernels.hpp"
#include "nn/onnx_writer.hpp"
#include "nn/op_registry.hpp"
#include "ringtrain/model.pb.h"
#include "test_util.hpp"

namespace ringtrain::test {
namespace {

// PyTorch's form of an activation, of a float64 tensor x, where it is not
// torch.nn.functional.<name>(x).
const std::map<std::string, std::string> kTorchForms = {
    {"gelu_tanh", "torch.nn.functional.gelu(x, approximate='tanh')"},
};

std::string torch_form(const std::string& name) {
  const auto it = kTorchForms.find(name);
  return it != kTorchForms.end() ? it->second : "torch.nn.functional." + name + "(x)";
}

// argv: input file (float32 x then dy, n each), output file (float64 y then dx, then the ONNX
// form's y when a node file is given), n, expression[, node file]. The node file holds one
// ONNX node a line, "OP OUTPUT INPUT...", or an fp32 initialiser, "= NAME VALUE"; it reads
// the value "x", and its last line's output is y.
constexpr const char* kScript = R"(
import sys, numpy as np, torch
n = int(sys.argv[3])
v = np.fromfile(sys.argv[1], dtype=np.float32).astype(np.float64)
x = torch.tensor(v[:n], requires_grad=True)
dy = torch.tensor(v[n:])
y = eval(sys.argv[4])
y.backward(dy)
out = [y.detach().numpy(), x.grad.numpy()]
if len(sys.argv) > 5:
    ops = {"Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Erf": torch.erf,
           "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}
    vals = {"x": torch.tensor(v[:n])}
    for line in open(sys.argv[5]):
        w = line.split()
        if w[0] == "=":
            vals[w[1]] = torch.tensor(float(w[2]), dtype=torch.float64)
        else:
            vals[w[1]] = ops[w[0]](*[vals[i] for i in w[2:]])
    out.append(vals[w[1]].numpy())
np.concatenate(out).astype(np.float64).tofile(sys.argv[2])
)";

// y and dx of `expr` by PyTorch on x and dy (float64 results); with `onnx_nodes` (the node
// file's text), also the ONNX form's y.
void torch_reference(const std::string& expr, const std::vector<float>& x,
                     const std::vector<float>& dy, std::vector<double>& y, std::vector<double>& dx,
                     const std::string& onnx_nodes = {}, std::vector<double>* onnx_y = nullptr) {
  const std::string dir = ::testing::TempDir();
  const std::string script = dir + "rt_activation_ref.py", in = dir + "rt_activation_in.bin",
                    out = dir + "rt_activation_out.bin", nodes = dir + "rt_activation_onnx.txt";
  std::ofstream(script) << kScript;
  {
    std::ofstream f(in, std::ios::binary);
    f.write(reinterpret_cast<const char*>(x.data()), std::streamsize(x.size() * 4));
    f.write(reinterpret_cast<const char*>(dy.data()), std::streamsize(dy.size() * 4));
  }
  std::string cmd = "OMP_NUM_THREADS=1 /usr/bin/python3 " + script + " " + in + " " + out + " " +
                    std::to_string(x.size()) + " \"" + expr + "\"";
  if (onnx_y) {
    std::ofstream(nodes) << onnx_nodes;
    cmd += " " + nodes;
  }
  std::remove(out.c_str());
  ASSERT_EQ(std::system(cmd.c_str()), 0)
      << cmd << "\n(no PyTorch form? add the activation to kTorchForms)";
  std::vector<double> r((onnx_y ? 3 : 2) * x.size());
  std::ifstream f(out, std::ios::binary);
  f.read(reinterpret_cast<char*>(r.data()), std::streamsize(r.size() * 8));
  ASSERT_TRUE(f) << "short output from " << cmd;
  const auto n = std::ptrdiff_t(x.size());
  y.assign(r.begin(), r.begin() + n);
  dx.assign(r.begin() + n, r.begin() + 2 * n);
  if (onnx_y) onnx_y->assign(r.begin() + 2 * n, r.end());
}

// x and dy rounded through `t` and back (what a tensor of dtype t holds).
std::vector<float> through(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> raw(v.size() * dtype_size(t));
  kernels::host_from_f32(v.data(), raw.data(), t, int64_t(v.size()));
  std::vector<float> back(v.size());
  kernels::host_to_f32(raw.data(), t, back.data(), int64_t(v.size()));
  return back;
}

// x on [-10, 10] in steps of 1/200 (0 included), then random points in [-30, 30]; dy random;
// both rounded through t.
void inputs(DType t, std::vector<float>& x, std::vector<float>& dy) {
  const size_t n = 4001;
  std::vector<float> x0(n), dy0 = uniform_floats(n, -2.f, 2.f, 7);
  for (size_t i = 0; i < n; ++i) x0[i] = -10.f + 20.f * float(i) / float(n - 1);
  const auto extra = uniform_floats(200, -30.f, 30.f, 11);
  x0.insert(x0.end(), extra.begin(), extra.end());
  dy0.resize(x0.size(), 0.5f);
  x = through(x0, t);
  dy = through(dy0, t);
}

// At most 5 failures of `what` (got against want) at x.
void expect_close(const char* what, const std::vector<float>& x, const std::vector<float>& got,
                  const std::vector<double>& want, double rtol, double atol) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (!close(got[i], want[i], rtol, atol)) {
      ++bad;
      ADD_FAILURE() << what << " at index " << i << " x " << x[i] << ": got " << got[i]
                    << ", PyTorch " << want[i];
    }
}

// Tolerance: fp32 within PyTorch's own parity bound; 16 bits: one rounding of the result
// (half a unit in the last place) plus the fp32 arithmetic before it.
double rtol_of(DType t) {
  return t == DType::f32 ? 1e-5 : t == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
}
double atol_of(DType t) { return t == DType::f32 ? 1e-6 : 1e-5; }

class ActivationTorch : public ::testing::TestWithParam<DType> {};

// Every pointwise kernel of the CPU table.
TEST_P(ActivationTorch, ForwardAndBackwardMatchPyTorch) {
  const DType t = GetParam();
  std::vector<float> x, dy;
  inputs(t, x, dy);
  const int64_t m = int64_t(x.size());
  auto be = kernels::make_cpu_backend(2);
  const std::vector<std::string> ops = be->kernel_table().unary_ops();
  ASSERT_GE(ops.size(), 2u);
  for (const std::string& op : ops) {
    SCOPED_TRACE(op);
    ASSERT_TRUE(be->supports(op, t));
    std::vector<double> ry, rdx;
    torch_reference(torch_form(op), x, dy, ry, rdx);
    std::vector<uint8_t> bx(size_t(m) * dtype_size(t)), bdy(bx.size()), by(bx.size()),
        bdx(bx.size());
    kernels::host_from_f32(x.data(), bx.data(), t, m);
    kernels::host_from_f32(dy.data(), bdy.data(), t, m);
    const Tensor tx(bx.data(), {m}, t), tdy(bdy.data(), {m}, t), ty(by.data(), {m}, t),
        tdx(bdx.data(), {m}, t);
    be->unary(op, tx, ty);
    be->unary_backward(op, tx, tdy, tdx);
    std::vector<float> y(static_cast<size_t>(m)), dx(static_cast<size_t>(m));
    kernels::host_to_f32(by.data(), t, y.data(), m);
    kernels::host_to_f32(bdx.data(), t, dx.data(), m);
    expect_close("forward", x, y, ry, rtol_of(t), atol_of(t));
    expect_close("backward", x, dx, rdx, rtol_of(t), atol_of(t));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ActivationTorch,
                         ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Records what an op's ONNX hook writes, as the node file of kScript: the node reads "x".
class RecordingWriter final : public OnnxWriter {
 public:
  std::string text;
  std::string input(size_t k) const override { return k == 0 ? "x" : "?"; }
  std::string output() const override { return "y"; }
  std::string param(const std::string& p) override {
    ADD_FAILURE() << "an activation has no parameter " << p;
    return p;
  }
  bool has_param(const std::string&) const override { return false; }
  std::string buffer(const std::string& b) override {
    ADD_FAILURE() << "an activation has no buffer " << b;
    return b;
  }
  int64_t max_sequence() const override { return 0; }
  void node(const std::string& op, const std::string& name, const std::vector<std::string>& in,
            const std::vector<std::string>& out, const std::vector<OnnxAttr>& attrs) override {
    EXPECT_TRUE(attrs.empty()) << op << " " << name << ": attributes are not evaluated here";
    EXPECT_EQ(out.size(), 1u) << op << " " << name;
    text += op + " " + out.at(0);
    for (const auto& i : in) text += " " + i;
    text += "\n";
  }
  std::string weight(const std::string& name, const Shape& shape, const float* data) override {
    EXPECT_TRUE(shape.empty()) << name << ": only scalar initialisers are evaluated here";
    char v[32];
    std::snprintf(v, sizeof v, "%.9g", double(*data));
    text += "= " + name + " " + v + "\n";
    return name;
  }
  std::string ints(const std::string& name, const std::vector<int64_t>&) override {
    ADD_FAILURE() << name << ": int64 initialisers are not evaluated here";
    return name;
  }
};

// Every activation kind of model.proto, as a model file names it: the layer the activation op
// builds (forward and backward, fp32 on the CPU) and its ONNX form against PyTorch.
TEST(ActivationKinds, LayerAndOnnxFormMatchPyTorch) {
  std::vector<float> x, dy;
  inputs(DType::f32, x, dy);
  const int64_t m = int64_t(x.size());
  auto be = kernels::make_cpu_backend(2);
  Context ctx{*be, DType::f32, true};
  const OpDef* op = find_op("activation");
  ASSERT_TRUE(op && op->onnx);
  const auto* kinds = pb::Activation_descriptor();
  ASSERT_GE(kinds->value_count(), 4);
  for (int k = 0; k < kinds->value_count(); ++k) {
    if (kinds->value(k)->number() == pb::NONE) continue;
    std::string name = kinds->value(k)->name();
    SCOPED_TRACE(name);
    pb::Node def;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
        "name: \"act\" activation { kind: " + name + " }", &def));
    for (char& c : name) c = char(std::tolower(static_cast<unsigned char>(c)));
    const std::vector<Shape> in_shapes = {{m}};
    const OpNode node{def, def.name(), in_shapes};
    ASSERT_EQ(op->infer(node), Shape{m});
    RecordingWriter onnx;
    ASSERT_EQ(op->onnx(node, onnx), "y");
    std::vector<double> ry, rdx, ronnx;
    torch_reference(torch_form(name), x, dy, ry, rdx, onnx.text, &ronnx);
    expect_close("ONNX form", x, std::vector<float>(ronnx.begin(), ronnx.end()), ry, 1e-6, 1e-6);

    const std::unique_ptr<Layer> layer = op->build(node);
    const Tensor tx(x.data(), {1, m}, DType::f32), tdy(dy.data(), {1, m}, DType::f32);
    const Tensor& ty = layer->forward(ctx, tx);
    const std::vector<float> y(ty.as<float>(), ty.as<float>() + m);
    const Tensor& tdx = layer->backward(ctx, tdy);
    const std::vector<float> dx(tdx.as<float>(), tdx.as<float>() + m);
    expect_close("layer forward", x, y, ry, rtol_of(DType::f32), atol_of(DType::f32));
    expect_close("layer backward", x, dx, rdx, rtol_of(DType::f32), atol_of(DType::f32));
  }
}

}  // namespace
}  // namespace ringtrain::test
