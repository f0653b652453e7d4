#!/usr/bin/env python3
"""The PyTorch peer of ringtrain's GPT throughput: the same GPT-2 (token + positional
embedding, pre-norm blocks with causal self-attention and a tanh-GELU MLP, final layer norm,
head tied to the embedding; models/gpt-tiny.pbtxt) trained with AdamW, under
DistributedDataParallel over gloo when started by mpirun with several ranks; docs/benchmarks.md
(gpt_bench) has the commands that compare it with ringtrain's gpt_bench.

    mpirun -n 2 -x MASTER_PORT=29512 build-cpu/peers/torch/bin/python \\
        benchmarks/peers/torch_gpt.py --layers 4 --width 128 --heads 4 --seq-len 64 \\
        --batch-size 8 --steps 60 --threads 1 [--precision bf16] [--compile] \\
        [--adamw fused|foreach] [--json FILE]

AdamW runs PyTorch's fused CPU kernel by default (`fused=True`, PyTorch 2.4 and later: one
pass over each parameter, the fastest of its implementations); `--adamw foreach` selects the
multi-tensor one that is PyTorch's default. Tokens are random ids drawn once (the figure is the training step, not data loading). Rank 0
prints tokens/s (all ranks together) as the median over windows of --window steps after
--warmup steps.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--steps", type=int, default=60, help="steps in all, warm-up included")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (PyTorch 2)")
    p.add_argument("--adamw", choices=["fused", "foreach"], default="fused",
                   help="AdamW implementation: the fused CPU kernel (default) or PyTorch's default")
    p.add_argument("--json", help="write the result as one JSON object (rank 0)")
    a = p.parse_args()
    if a.steps - a.warmup < a.window:
        p.error(f"--steps {a.steps} leaves no full window of {a.window} after --warmup {a.warmup}")
    return a


args = parse()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
if world > 1:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    dist.init_process_group("gloo", rank=rank, world_size=world)


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.fc_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2: fused (flash) attention
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.h)
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte = nn.Embedding(a.vocab, a.width)
        self.wpe = nn.Embedding(a.seq_len, a.width)
        self.blocks = nn.ModuleList(Block(a.width, a.heads) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.width)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


torch.manual_seed(42)
model = GPT(args)
decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "wte" not in n and "wpe" not in n]
other = [p for n, p in model.named_parameters() if not any(p is q for q in decay)]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                         {"params": other, "weight_decay": 0.0}], lr=3e-4,
                        **({"fused": True} if args.adamw == "fused" else {"foreach": True}))
net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
if args.compile:
    net = torch.compile(net)
g = torch.Generator().manual_seed(1 + rank)
data = torch.randint(0, args.vocab, (args.batch_size, args.seq_len + 1), generator=g)
x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()


def step():
    opt.zero_grad(set_to_none=True)
    if args.precision == "bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = net(x, y)
    else:
        loss = net(x, y)
    loss.backward()
    opt.step()
    return loss


for _ in range(args.warmup):
    step()
rates = []
tokens = args.batch_size * args.seq_len * world
for _ in range((args.steps - args.warmup) // args.window):
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.window):
        loss = step()
    if world > 1:
        dist.barrier()
    rates.append(tokens * args.window / (time.perf_counter() - t0))
if rank == 0:
    res = {"framework": "pytorch", "torch": torch.__version__, "compile": args.compile,
           "precision": args.precision, "layers": args.layers, "width": args.width,
           "heads": args.heads, "adamw": args.adamw, "seq_len": args.seq_len,
           "batch_size": args.batch_size, "ranks": world, "threads": args.threads, "tokens_per_sec": statistics.median(rates),
           "windows": rates, "loss": loss.item()}
    print(f"pytorch {torch.__version__} {args.precision}{' compile' if args.compile else ''}"
          f" (AdamW {args.adamw}): "
          f"{res['tokens_per_sec']:.1f} tokens/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(res) + "\n")
if world > 1:
    dist.destroy_process_group()
sys.exit(0)
