#!/usr/bin/env python3
"""Training data for the heat-equation surrogate (README.md): NumPy only.

Each sample is an initial temperature field u0 on a 32 x 32 grid (a sum of a few random
Gaussian blobs, hot and cold); its target is the field after STEPS explicit finite-difference
steps of the 2-D heat equation du/dt = alpha * laplace(u) with the boundary held at 0
(u <- u + alpha * (4-neighbour sum - 4 u), alpha = 0.2 < 1/4, so the scheme is stable).

Writes OUT/{train,val}_{x,y}.npy, float32 [N, 1, 32, 32], for `ringtrain convert npy
--images X --targets Y`.
"""
import argparse
import os

import numpy as np


def initial_fields(rng, n, size):
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    u = np.zeros((n, size, size), np.float32)
    for i in range(n):
        for _ in range(rng.integers(2, 6)):
            cy, cx = rng.uniform(4, size - 4, 2)
            width = rng.uniform(1.5, 4.0)
            u[i] += rng.uniform(-1, 1) * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * width**2))
    return u


def evolve(u, steps, alpha):
    u = u.copy()
    for _ in range(steps):
        p = np.pad(u, ((0, 0), (1, 1), (1, 1)))  # the boundary at 0
        lap = p[:, :-2, 1:-1] + p[:, 2:, 1:-1] + p[:, 1:-1, :-2] + p[:, 1:-1, 2:] - 4 * u
        u = u + alpha * lap
    return u


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="heat_data", help="output directory (default heat_data)")
    ap.add_argument("--train", type=int, default=2048, help="training samples (default 2048)")
    ap.add_argument("--val", type=int, default=256, help="validation samples (default 256)")
    ap.add_argument("--steps", type=int, default=6, help="heat-equation steps (default 6)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    os.makedirs(a.out, exist_ok=True)
    for split, n in (("train", a.train), ("val", a.val)):
        x = initial_fields(rng, n, 32)
        y = evolve(x, a.steps, 0.2)
        np.save(os.path.join(a.out, f"{split}_x.npy"), x[:, None].astype(np.float32))
        np.save(os.path.join(a.out, f"{split}_y.npy"), y[:, None].astype(np.float32))
    print(f"wrote {a.out}/{{train,val}}_{{x,y}}.npy: {a.train} + {a.val} fields of 32 x 32, {a.steps} steps")


if __name__ == "__main__":
    main()
