#!/usr/bin/python3
"""Reference values for the training-recipe tests, computed with PyTorch's own schedulers
and loss (an independent implementation) and written to an HDF5 file the C++ tests read.

    /usr/bin/python3 tests/ref/make_recipe_ref.py tests/ref/recipe_ref.h5

Needs Debian's python3-torch and python3-h5py. Deterministic (torch.manual_seed(0)).

Layout:
  /schedule/<case>  lr [T] float64: the learning rate of optimizer step t+1, read from the
                    optimizer's param group before opt.step(); sched.step() after it (the
                    PyTorch loop). Attributes: name, base_lr, warmup_steps, warmup_init_lr,
                    min_lr, decay_steps, step_every, step_gamma. Warm-up steps come from
                    LinearLR (or LambdaLR t/W when it starts at 0, which LinearLR refuses),
                    the rest from a second scheduler started at the end of warm-up:
                    CosineAnnealingLR(T_max = D - W, eta_min), LinearLR(1 -> min/base over
                    D - W), StepLR, LambdaLR(1) for constant, and fairseq's inverse-sqrt
                    rule as a LambdaLR.
  /xent/<case>      logits [N, C] float32, labels [N] int32 -> loss_sum (attribute, float64,
                    reduction='sum'), dlogits [N, C] float32 (the gradient of the mean loss);
                    attribute smoothing. F.cross_entropy(..., label_smoothing=eps) in float64.
"""
import math
import sys

import h5py
import numpy as np
import torch
from torch.optim import SGD
from torch.optim.lr_scheduler import (CosineAnnealingLR, LambdaLR, LinearLR, StepLR)


def lrs(make, base, steps):
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = SGD([p], lr=base)
    sched = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def schedule(name, base, total, warmup=0, init=0.0, min_lr=0.0, decay=0, every=0, gamma=0.1):
    d = decay or total
    out = []
    if warmup:
        if init > 0:
            out += lrs(lambda o: LinearLR(o, start_factor=init / base, end_factor=1.0,
                                          total_iters=warmup), base, warmup)
        else:
            out += lrs(lambda o: LambdaLR(o, lambda t: t / warmup), base, warmup)
    rest = total - warmup
    if name == "cosine":
        make = lambda o: CosineAnnealingLR(o, T_max=d - warmup, eta_min=min_lr)
    elif name == "linear":
        make = lambda o: LinearLR(o, start_factor=1.0, end_factor=min_lr / base,
                                  total_iters=d - warmup)
    elif name == "step":
        make = lambda o: StepLR(o, step_size=every, gamma=gamma)
    elif name == "inverse-sqrt":
        w = max(warmup, 1)
        make = lambda o: LambdaLR(o, lambda t: math.sqrt(w) / math.sqrt(max(t + warmup, 1)))
    else:
        make = lambda o: LambdaLR(o, lambda t: 1.0)
    out += lrs(make, base, rest)
    attrs = dict(name=name, base_lr=base, warmup_steps=warmup, warmup_init_lr=init,
                 min_lr=min_lr, decay_steps=decay, step_every=every, step_gamma=gamma)
    return np.array(out, dtype=np.float64), attrs


CASES = {
    "constant": ("constant", 0.1, 30, dict()),
    "constant_warmup": ("constant", 0.1, 40, dict(warmup=10)),
    "cosine": ("cosine", 0.05, 60, dict(min_lr=1e-4)),
    "cosine_warmup": ("cosine", 0.1, 80, dict(warmup=8, init=1e-3, min_lr=1e-5)),
    "cosine_decay_steps": ("cosine", 0.02, 50, dict(warmup=5, decay=50)),
    "linear_warmup": ("linear", 0.01, 45, dict(warmup=5, min_lr=1e-3)),
    "step": ("step", 0.1, 50, dict(warmup=4, every=7, gamma=0.5)),
    "inverse_sqrt": ("inverse-sqrt", 0.01, 60, dict(warmup=12)),
    "inverse_sqrt_nowarm": ("inverse-sqrt", 0.01, 20, dict()),
}


def main(path):
    torch.manual_seed(0)
    with h5py.File(path, "w") as f:
        g = f.create_group("schedule")
        for case, (name, base, total, kw) in CASES.items():
            lr, attrs = schedule(name, base, total, **kw)
            ds = g.create_dataset(case, data=lr)
            for k, v in attrs.items():
                ds.attrs[k] = v
        x = f.create_group("xent")
        for case, (n, c, eps) in {"eps0": (6, 5, 0.0), "eps01": (8, 10, 0.1),
                                   "eps03": (5, 7, 0.3)}.items():
            logits = (torch.randn(n, c) * 3).float()
            labels = torch.randint(0, c, (n,), dtype=torch.int32)
            l64 = logits.double().requires_grad_(True)
            loss = torch.nn.functional.cross_entropy(l64, labels.long(), label_smoothing=eps,
                                                     reduction="mean")
            loss.backward()
            grp = x.create_group(case)
            grp.create_dataset("logits", data=logits.numpy())
            grp.create_dataset("labels", data=labels.numpy())
            grp.create_dataset("dlogits", data=l64.grad.float().numpy())
            grp.attrs["loss_sum"] = float(loss.item() * n)
            grp.attrs["smoothing"] = eps


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "recipe_ref.h5")
