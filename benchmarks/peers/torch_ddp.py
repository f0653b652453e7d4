#!/usr/bin/env python3
"""The PyTorch peer of ringtrain's training benchmark: the same MLP (784-512-256-10) or
CNN, trained with DistributedDataParallel over gloo on the CPU, one process per rank under
mpirun, on the same Fashion-MNIST HDF5 file. Used by benchmarks/peers/run.sh.

    mpirun -n 2 -x MASTER_PORT=29511 build/peers/torch/bin/python benchmarks/peers/torch_ddp.py \
        --model cnn --batch-size 128 --steps 100 --threads 1 [--json FILE]

The whole dataset is normalised once ((v/255 - mean) / std, the file's attributes, as
ringtrain's loader does) and kept in memory as one tensor; each step gathers this rank's
slice of the global batch from a per-epoch permutation, so data loading costs next to
nothing and the figure is the training step. Rank 0 prints samples/s (all ranks together)
as the median over windows of --window steps after --warmup steps, and with --json writes
it with every window's figure.
"""
import argparse
import json
import os
import statistics
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--data", default=os.path.join(os.path.dirname(__file__),
                                                  "../../build/demo/data/fashion-train.h5"))
    p.add_argument("--batch-size", type=int, default=128, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=200, help="steps in all, warm-up included")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    p.add_argument("--window", type=int, default=20, help="steps per timing window")
    p.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: autocast to bfloat16 (fp32 weights)")
    p.add_argument("--channels-last", action="store_true",
                   help="cnn: NHWC activations and weights (oneDNN's preferred layout)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", help="write the result as one JSON object (rank 0)")
    a = p.parse_args()
    if a.steps - a.warmup < a.window:
        p.error(f"--steps {a.steps} leaves no full window of {a.window} after --warmup {a.warmup}")
    return a


args = parse()
# Before torch loads: the BLAS (OpenBLAS through libblas.so.3) and OpenMP read these once.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import h5py  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def make_model(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                             nn.ReLU(), nn.Linear(256, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(), nn.Linear(9216, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def load(path):
    with h5py.File(path, "r") as f:
        images, labels = f["images"][()], f["labels"][()]
        mean, std = float(f.attrs.get("mean", 0.0)), float(f.attrs.get("std", 1.0))
    x = torch.from_numpy(images).float().div_(255.0).sub_(mean).div_(std)
    if x.dim() == 2:  # [N, 784] files hold the same pixels
        x = x.view(-1, 1, 28, 28)
    return x.contiguous(), torch.from_numpy(labels).long()


def main():
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", 0)))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    torch.manual_seed(args.seed)
    x_all, y_all = load(args.data)
    n, b = x_all.shape[0], args.batch_size
    steps_per_epoch = n // (b * world)
    model = make_model(args.model)
    layout = torch.channels_last if args.channels_last else torch.contiguous_format
    if args.channels_last:
        model = model.to(memory_format=layout)
        x_all = x_all.contiguous(memory_format=layout)
    # gradient_as_bucket_view: gradients live in the allreduce buckets (no copy in and out)
    model = DDP(model, gradient_as_bucket_view=True)  # broadcasts rank 0's parameters
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()

    perm, epoch = None, -1
    times, losses = [], []
    for step in range(args.steps):
        if step % steps_per_epoch == 0:  # the same global permutation on every rank
            epoch += 1
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed + epoch))
        k = step % steps_per_epoch
        idx = perm[(k * world + rank) * b:(k * world + rank + 1) * b]
        x, y = x_all[idx].contiguous(memory_format=layout), y_all[idx]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=False)  # zero the bucket views in place
        loss.backward()  # DDP allreduces the gradient buckets during backward
        opt.step()
        if step + 1 >= args.warmup and (step + 1 - args.warmup) % args.window == 0:
            times.append(time.perf_counter())
            losses.append(loss.item())

    rates = [args.window * b * world / (t1 - t0) for t0, t1 in zip(times, times[1:])]
    if rank == 0:
        result = dict(framework="pytorch-ddp", torch_version=str(torch.__version__),
                      model=args.model, ranks=world, batch_per_rank=b, threads=args.threads,
                      precision=args.precision, channels_last=args.channels_last,
                      steps=args.steps, warmup=args.warmup, window=args.window, samples_per_sec=statistics.median(rates),
                      window_samples_per_sec=rates, loss=losses[-1])
        print(f"pytorch-ddp {args.model} {world} rank(s) {args.precision}: "
              f"{result['samples_per_sec']:.1f} samples/s (median of {len(rates)} windows of "
              f"{args.window} steps), loss {losses[-1]:.4f}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f)
                f.write("\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
