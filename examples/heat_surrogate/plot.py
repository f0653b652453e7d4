#!/usr/bin/env python3
"""Prediction against truth for the heat-equation surrogate (README.md), as a PNG.

Reads the validation inputs and targets (make_data.py) and the outputs `ringtrain predict`
wrote (.npy, [N, 1, 32, 32]); prints the relative L2 error over all samples,
||pred - truth|| / ||truth||, and draws input, truth, prediction and error of a few samples.
"""
import argparse

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--x", required=True, help="inputs .npy (val_x.npy)")
    ap.add_argument("--y", required=True, help="targets .npy (val_y.npy)")
    ap.add_argument("--pred", required=True, help="predictions .npy (ringtrain predict --out P.npy)")
    ap.add_argument("--out", default="", help="PNG to write (none: only the error)")
    ap.add_argument("--samples", type=int, default=3)
    a = ap.parse_args()
    x, y, p = np.load(a.x), np.load(a.y), np.load(a.pred)
    assert p.shape == y.shape, f"predictions {p.shape} but targets {y.shape}"
    rel = float(np.linalg.norm(p - y) / np.linalg.norm(y))
    print(f"relative L2 error {rel:.4f} over {len(y)} samples")
    if not a.out:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = min(a.samples, len(y))
    fig, axes = plt.subplots(k, 4, figsize=(10, 2.5 * k), squeeze=False)
    for i in range(k):
        lim = float(np.abs(y[i, 0]).max())
        for j, (img, title) in enumerate(((x[i, 0], "initial field"), (y[i, 0], "truth"),
                                          (p[i, 0], "prediction"), (p[i, 0] - y[i, 0], "error"))):
            ax = axes[i][j]
            im = ax.imshow(img, cmap="RdBu_r", vmin=-lim if j else None, vmax=lim if j else None)
            ax.set_title(title)
            ax.axis("off")
            fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(f"heat-equation surrogate: relative L2 error {rel:.4f}")
    fig.tight_layout()
    fig.savefig(a.out, dpi=100)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
