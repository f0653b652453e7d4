#!/usr/bin/env python3
"""The GEMMs of one training step of a GPT (forward and backward of every linear layer and
the tied language-model head; attention not included), timed one by one with torch.matmul on
one thread: the floor of a step's time at PyTorch's own GEMM rate. Set against the step time
that benchmarks/peers/torch_gpt.py measures for the same shapes, it bounds how much faster
than PyTorch any framework can train with GEMMs no faster than these (docs/benchmarks.md,
"gpt_bench").

    build-cpu/peers/torch/bin/python benchmarks/peers/torch_gpt_gemms.py --layers 6 \\
        --width 384 --seq-len 256 --batch-size 4 [--precision bf16]
"""
import argparse
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4, help="sequences per rank")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    torch.set_num_threads(1)
    dt = torch.float32 if a.precision == "fp32" else torch.bfloat16
    rows, c = a.batch_size * a.seq_len, a.width
    # (in, out, count per step) of each linear: qkv, attention projection, fc, fc projection
    # per layer, and the head tied to the embedding.
    linears = [(c, 3 * c, a.layers), (c, c, a.layers), (c, 4 * c, a.layers),
               (4 * c, c, a.layers), (c, a.vocab, 1)]
    total_s, total_flop = 0.0, 0.0
    print(f"torch {torch.__version__} {a.precision}, 1 thread, {rows} rows per step")
    for fin, fout, count in linears:
        x = torch.randn(rows, fin, dtype=dt)
        w = torch.randn(fout, fin, dtype=dt)
        dy = torch.randn(rows, fout, dtype=dt)
        # forward y = x w^T, backward dx = dy w, dw = dy^T x
        for name, f in (("y = x w^T", lambda: x @ w.t()), ("dx = dy w", lambda: dy @ w),
                        ("dw = dy^T x", lambda: dy.t() @ x)):
            for _ in range(3):
                f()
            times = []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                f()
                times.append(time.perf_counter() - t0)
            s = statistics.median(times)
            flop = 2.0 * rows * fin * fout
            total_s += s * count
            total_flop += flop * count
            print(f"  [{fin:5d} -> {fout:5d}] {name:12s} x{count}: {s * 1e3:7.3f} ms "
                  f"{flop / s / 1e9:7.1f} GFLOP/s")
    print(f"GEMMs per step: {total_flop / 1e9:.2f} GFLOP in {total_s * 1e3:.1f} ms "
          f"({total_flop / total_s / 1e9:.1f} GFLOP/s): at most {rows / total_s:.0f} tokens/s "
          f"per rank from the GEMMs alone")


if __name__ == "__main__":
    main()
