#!/usr/bin/env python3
"""The PyTorch peer of ringtrain's Llama training speed (benchmarks/peers/llama.sh): the same
Llama as models/llama-tiny.pbtxt (token embedding, pre-norm layers of RMS norm, causal
grouped-query attention with rotary embeddings (HF's rotate_half) and a SwiGLU MLP, a final
RMS norm, an untied head, no biases) trained with AdamW on random tokens, under
DistributedDataParallel over gloo when started by mpirun with several ranks.

    mpirun -n 2 -x MASTER_PORT=29513 /usr/bin/python3 benchmarks/peers/torch_llama.py \\
        --layers 4 --width 128 --heads 4 --kv-heads 2 --ffn 352 --seq-len 64 --batch-size 8 \\
        --steps 60 --threads 1 [--precision bf16] [--compile] [--json FILE]

AdamW is PyTorch's fused CPU kernel where the installed PyTorch has it (2.4 and later), else
its multi-tensor (foreach) one. Rank 0 prints tokens/s (all ranks together) as the median over
windows of --window steps after --warmup steps.
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
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--ffn", type=int, default=352)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--steps", type=int, default=60, help="steps in all, warm-up included")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (PyTorch 2)")
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
    os.environ.setdefault("MASTER_PORT", "29513")
    dist.init_process_group("gloo", rank=rank, world_size=world)


class RMSNorm(nn.Module):
    def __init__(self, c, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(c)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Layer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.h, self.kv, self.d = a.heads, a.kv_heads, a.width // a.heads
        c, kvc = a.width, a.kv_heads * (a.width // a.heads)
        self.n1, self.n2 = RMSNorm(c), RMSNorm(c)
        self.q, self.k = nn.Linear(c, c, bias=False), nn.Linear(c, kvc, bias=False)
        self.v, self.o = nn.Linear(c, kvc, bias=False), nn.Linear(c, c, bias=False)
        self.gate, self.up = nn.Linear(c, a.ffn, bias=False), nn.Linear(c, a.ffn, bias=False)
        self.down = nn.Linear(a.ffn, c, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, t, self.h, self.d).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv, self.d).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv, self.d).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.h // self.kv, dim=1)
        v = v.repeat_interleave(self.h // self.kv, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2: fused attention
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.d)
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + self.o(y.transpose(1, 2).reshape(b, t, c))
        m = self.n2(x)
        return x + self.down(F.silu(self.gate(m)) * self.up(m))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = nn.Embedding(a.vocab, a.width)
        self.layers = nn.ModuleList(Layer(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.width)
        self.head = nn.Linear(a.width, a.vocab, bias=False)
        d = a.width // a.heads
        ang = torch.arange(a.seq_len)[:, None] * 10000.0 ** (-torch.arange(0, d, 2) / d)[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, idx, targets):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


torch.manual_seed(42)
model = Llama(args)
decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n]
other = [p for n, p in model.named_parameters() if not any(p is q for q in decay)]
fused = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4)
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                         {"params": other, "weight_decay": 0.0}], lr=3e-4,
                        **({"fused": True} if fused else {"foreach": True}))
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
           "precision": args.precision, "adamw": "fused" if fused else "foreach",
           "ranks": world, "threads": args.threads, "tokens_per_sec": statistics.median(rates),
           "windows": rates, "loss": loss.item()}
    print(f"pytorch {torch.__version__} {args.precision}{' compile' if args.compile else ''}"
          f" (AdamW {res['adamw']}): {res['tokens_per_sec']:.1f} tokens/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(res) + "\n")
if world > 1:
    dist.destroy_process_group()
sys.exit(0)
