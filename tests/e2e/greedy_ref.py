#!/usr/bin/python3
"""Greedy continuation of a prompt by the GPT in a ringtrain checkpoint, computed with PyTorch
(an independent implementation of GPT-2 as models/gpt-tiny.pbtxt defines it, in float64):
the reference `ringtrain sample --top-k 1` is checked against.

    greedy_ref.py CKPT HEADS WINDOW PROMPT_FILE TOKENS GOT_FILE

Reads /params/* of CKPT (the checkpoint's fp32 masters), continues the bytes of PROMPT_FILE
by TOKENS tokens, always taking the most likely of the first 256 logits (the byte
vocabulary) over the last WINDOW tokens, and compares with the bytes of GOT_FILE (prompt +
continuation, as `sample` prints them without the final newline). Where they differ, the
reference's two best logits must be a tie (within 1e-5): then either choice is right and
the comparison ends there. Exit 0 when they agree, 1 otherwise.
"""
import math
import sys

import h5py
import torch
import torch.nn.functional as F

V = 256


def load(path):
    with h5py.File(path, "r") as f:
        return {k: torch.from_numpy(f["params"][k][()]).double() for k in f["params"].keys()}


def logits_of(p, heads, ids):
    n_layer = len({k.split(".")[0] for k in p if k.startswith("block")})
    c = p["embed.wte"].shape[1]
    t = len(ids)
    tok = torch.tensor(ids, dtype=torch.int64)
    x = p["embed.wte"][tok] + p["embed.wpe"][torch.arange(t)]
    x = x.unsqueeze(0)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    hs = c // heads
    for i in range(n_layer):
        b = f"block{i}."
        h = F.layer_norm(x, (c,), p[b + "ln1.weight"], p[b + "ln1.bias"], 1e-5)
        q, k, v = F.linear(h, p[b + "qkv.weight"], p[b + "qkv.bias"]).split(c, dim=2)
        q, k, v = (u.view(1, t, heads, hs).transpose(1, 2) for u in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(1, t, c)
        x = x + F.linear(y, p[b + "attn_proj.weight"], p[b + "attn_proj.bias"])
        h = F.layer_norm(x, (c,), p[b + "ln2.weight"], p[b + "ln2.bias"], 1e-5)
        h = F.gelu(F.linear(h, p[b + "fc.weight"], p[b + "fc.bias"]), approximate="tanh")
        x = x + F.linear(h, p[b + "fc_proj.weight"], p[b + "fc_proj.bias"])
    x = F.layer_norm(x, (c,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    return (x[0, -1] @ p["embed.wte"].t())[:V]


def main(ckpt, heads, window, prompt_file, tokens, got_file):
    p = load(ckpt)
    ids = list(open(prompt_file, "rb").read())
    got = open(got_file, "rb").read()
    if len(got) != len(ids) + tokens or list(got[: len(ids)]) != ids:
        print(f"sample printed {len(got)} bytes, expected the prompt + {tokens}")
        return 1
    for k in range(tokens):
        z = logits_of(p, heads, ids[-window:])
        top2 = torch.topk(z, 2)
        want, mine = int(top2.indices[0]), got[len(ids)]
        if mine != want:
            gap = float(top2.values[0] - z[mine])
            if gap > 1e-5:
                print(f"token {k}: ringtrain chose {mine}, PyTorch {want} (logit gap {gap:.3g})")
                return 1
            print(f"token {k}: a tie (gap {gap:.3g}); compared {k} tokens")
            return 0
        ids.append(want)
    print(f"all {tokens} greedy tokens equal PyTorch's")
    return 0


if __name__ == "__main__":
    a = sys.argv[1:]
    sys.exit(main(a[0], int(a[1]), int(a[2]), a[3], int(a[4]), a[5]))
