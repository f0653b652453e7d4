#!/usr/bin/python3
"""Reference values for the CNN layer tests, computed with PyTorch (an independent
implementation) and written to an HDF5 file that the C++ tests read.

    /usr/bin/python3 tests/ref/make_layer_ref.py tests/ref/layer_ref.h5

Needs Debian's python3-torch and python3-h5py. Deterministic: torch.manual_seed(0), inputs
drawn in float32, every output computed in float64 from those float32 values, everything
stored as float32 (labels int32). All tensors are NCHW with PyTorch's conventions (conv
weight [out, in, kh, kw], linear weight [out, in]). In every group `dy` is a random
upstream gradient of y and dx / dweight / dbias are the gradients of sum(y * dy).

Layout (group: datasets; attributes):
  /conv_s1p1    x [2,3,7,6] weight [4,3,3,3] bias [4] -> y dy dx dweight dbias;
                stride=1 padding=1 has_bias=1
  /conv_s2p0    x [2,3,8,7] weight [5,3,3,3] bias [5] -> y dy dx dweight dbias;
                stride=2 padding=0 has_bias=1
  /conv_1x1_s2  x [2,4,6,6] weight [6,4,1,1] (no bias) -> y dy dx dweight;
                stride=2 padding=0 has_bias=0
  /maxpool2     x [2,3,6,7] (normal, no ties) -> y [2,3,3,3] dy dx; kernel=2 stride=2
                (floor mode: the last column is dropped and gets dx = 0)
  /avgpool_global  x [2,3,5,4] -> y [2,3] dy [2,3] dx
  /batchnorm_train x [4,3,5,5] weight [3] bias [3] running_mean [3] running_var [3]
                -> y dy dx dweight dbias running_mean_out running_var_out;
                momentum=0.1 eps=1e-5 (batch statistics with the biased variance for y;
                the running variance is updated with the unbiased one, as PyTorch does)
  /batchnorm_eval  the same x weight bias running_mean running_var, eval mode (y uses the
                running statistics) -> y dy dx dweight dbias; momentum=0.1 eps=1e-5
  /gelu         x [1000]: x[0:5] = 0, 1e-3, -1e-3, 3, -3 (as float32), the rest uniform
                in [-6, 6] -> y dy dx; exact erf GELU (approximate="none")
  /cnn          the CNN, dropout off: conv1 Conv2d(1,32,3) ReLU conv2 Conv2d(32,64,3) ReLU
                MaxPool2d(2) flatten fc1 Linear(9216,128) ReLU fc2 Linear(128,10);
                x [3,1,28,28] labels [3] int32 logits [3,10] loss (scalar, mean
                cross-entropy), params/<name> (PyTorch's default init after the seed),
                grads/<name> (gradients of the mean loss), names conv1.weight conv1.bias
                conv2.weight conv2.bias fc1.weight fc1.bias fc2.weight fc2.bias

Datasets of more than 16384 elements (the CNN's params and grads) are chunked and stored
with the shuffle + gzip filters to keep the file small; HDF5 reads them transparently.
"""
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

BIG = 16384  # elements above which a dataset is compressed


def put(g, name, t):
    """Store a tensor as float32 (int tensors as int32)."""
    a = t.detach().cpu().numpy()
    a = a.astype(np.int32) if np.issubdtype(a.dtype, np.integer) else a.astype(np.float32)
    if a.size > BIG:
        g.create_dataset(name, data=a, chunks=True, shuffle=True, compression="gzip",
                         compression_opts=9)
    else:
        g.create_dataset(name, data=a)


def randn(*shape):
    # float32 draws, widened: every input is exactly representable in float32
    return torch.randn(*shape, dtype=torch.float32).double()


def leaf(t):
    return t.clone().requires_grad_(True)


def grads_of(y, dy, *inputs):
    return torch.autograd.grad(y, inputs, grad_outputs=dy)


def conv_case(f, name, xs, ws, stride, padding, bias):
    x, w = leaf(randn(*xs)), leaf(randn(*ws))
    b = leaf(randn(ws[0])) if bias else None
    y = F.conv2d(x, w, b, stride=stride, padding=padding)
    dy = randn(*y.shape)
    g = f.create_group(name)
    g.attrs.update(stride=stride, padding=padding, has_bias=int(bias))
    put(g, "x", x)
    put(g, "weight", w)
    if bias:
        put(g, "bias", b)
        dx, dw, db = grads_of(y, dy, x, w, b)
        put(g, "dbias", db)
    else:
        dx, dw = grads_of(y, dy, x, w)
    put(g, "y", y)
    put(g, "dy", dy)
    put(g, "dx", dx)
    put(g, "dweight", dw)


def maxpool_case(f):
    x = leaf(randn(2, 3, 6, 7))
    # ties would make the argmax (and so dx) implementation-defined
    assert x.detach().flatten().unique().numel() == x.numel()
    y = F.max_pool2d(x, kernel_size=2, stride=2)
    dy = randn(*y.shape)
    (dx,) = grads_of(y, dy, x)
    g = f.create_group("maxpool2")
    g.attrs.update(kernel=2, stride=2)
    for k, v in dict(x=x, y=y, dy=dy, dx=dx).items():
        put(g, k, v)


def avgpool_case(f):
    x = leaf(randn(2, 3, 5, 4))
    y = x.mean(dim=(2, 3))
    dy = randn(*y.shape)
    (dx,) = grads_of(y, dy, x)
    g = f.create_group("avgpool_global")
    for k, v in dict(x=x, y=y, dy=dy, dx=dx).items():
        put(g, k, v)


def batchnorm_cases(f):
    momentum, eps = 0.1, 1e-5
    x0, w0, b0 = randn(4, 3, 5, 5), randn(3), randn(3)
    rm0 = (0.1 * torch.randn(3)).float().double()
    rv0 = (1 + 0.1 * torch.rand(3)).float().double()
    for name, training in (("batchnorm_train", True), ("batchnorm_eval", False)):
        x, w, b = leaf(x0), leaf(w0), leaf(b0)
        rm, rv = rm0.clone(), rv0.clone()
        y = F.batch_norm(x, rm, rv, w, b, training=training, momentum=momentum, eps=eps)
        dy = randn(*y.shape)
        dx, dw, db = grads_of(y, dy, x, w, b)
        g = f.create_group(name)
        g.attrs.update(momentum=momentum, eps=eps)
        out = dict(x=x, weight=w, bias=b, running_mean=rm0, running_var=rv0, y=y, dy=dy,
                   dx=dx, dweight=dw, dbias=db)
        if training:
            out.update(running_mean_out=rm, running_var_out=rv)
        for k, v in out.items():
            put(g, k, v)


def gelu_case(f):
    special = torch.tensor([0.0, 1e-3, -1e-3, 3.0, -3.0], dtype=torch.float32)
    rest = torch.rand(1000 - special.numel(), dtype=torch.float32) * 12 - 6
    x = leaf(torch.cat([special, rest]).double())
    y = F.gelu(x, approximate="none")
    dy = randn(*y.shape)
    (dx,) = grads_of(y, dy, x)
    g = f.create_group("gelu")
    g.attrs["approximate"] = "none"
    for k, v in dict(x=x, y=y, dy=dy, dx=dx).items():
        put(g, k, v)


class Cnn(torch.nn.Module):
    """The CNN of --model cnn, without its Dropout(0.25) (p = 0 here)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3)
        self.conv2 = torch.nn.Conv2d(32, 64, 3)
        self.fc1 = torch.nn.Linear(9216, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def cnn_case(f):
    model = Cnn()  # default init in float32, drawn after the seed
    model.double()  # exact: the float32 parameters are representable in float64
    x = randn(3, 1, 28, 28)
    labels = torch.randint(0, 10, (3,), dtype=torch.int64)
    logits = model(x)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    g = f.create_group("cnn")
    put(g, "x", x)
    put(g, "labels", labels)
    put(g, "logits", logits)
    g.create_dataset("loss", data=np.float32(loss.item()))
    params, grads = g.create_group("params"), g.create_group("grads")
    for name, p in model.named_parameters():
        put(params, name, p)
        put(grads, name, p.grad)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_layer_ref.py OUT.h5")
    torch.manual_seed(0)
    with h5py.File(sys.argv[1], "w") as f:
        f.attrs["generator"] = "tests/ref/make_layer_ref.py"
        f.attrs["torch_version"] = str(torch.__version__)
        conv_case(f, "conv_s1p1", (2, 3, 7, 6), (4, 3, 3, 3), 1, 1, True)
        conv_case(f, "conv_s2p0", (2, 3, 8, 7), (5, 3, 3, 3), 2, 0, True)
        conv_case(f, "conv_1x1_s2", (2, 4, 6, 6), (6, 4, 1, 1), 2, 0, False)
        maxpool_case(f)
        avgpool_case(f)
        batchnorm_cases(f)
        gelu_case(f)
        cnn_case(f)


if __name__ == "__main__":
    main()
