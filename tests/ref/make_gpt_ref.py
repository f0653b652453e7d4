#!/usr/bin/python3
"""Reference values for the GPT parity test (llm.c's test_gpt2), computed with PyTorch (an
independent implementation) and written to an HDF5 file that the C++ test reads.

    /usr/bin/python3 tests/ref/make_gpt_ref.py tests/ref/gpt_ref.h5

Needs Debian's python3-torch and python3-h5py. Deterministic (torch.manual_seed(0)): the
parameters and tokens are drawn once in float32, then everything is computed in float64 from
those values (the truth both ringtrain's fp32 and its mixed-precision runs are measured
against) and stored as float64 (tokens int32).

The model is GPT-2 as llm.c computes it, tiny: vocabulary 61 padded to 64 (the padded logits
take no part in the softmax), T = 16, 2 layers, 2 heads, width 32, learned positional
embedding, pre-norm blocks x += proj(attn(ln1(x))); x += proj(gelu_tanh(fc(ln2(x)))), a
final layer norm (eps 1e-5) and the language-model head tied to the token embedding.

Layout:
  attrs: vocab_size padded_vocab_size seq_len n_layer n_head n_embd batch
         lr beta1 beta2 eps weight_decay steps ln_eps
  /tokens, /targets   int32 [batch, seq_len]
  /params/NAME        initial values; attribute decay = 1 for the parameters AdamW decays
                      (the Linear weights; not biases, norms or embeddings)
  /logits             [batch, seq_len, padded_vocab_size] of the initial parameters
  /loss               scalar: mean token cross-entropy of the initial parameters
  /grads/NAME         gradient of /loss for each parameter (the tied embedding's gradient
                      sums the lookup and the head)
  /losses             [steps]: the loss before each of `steps` AdamW steps, full batch
Parameter names: embed.wte [Vp, C], embed.wpe [T, C], then per block i (0-based)
block{i}.ln1.{weight,bias}, block{i}.qkv.{weight [3C, C],bias}, block{i}.attn_proj.{weight,bias},
block{i}.ln2.{weight,bias}, block{i}.fc.{weight [4C, C],bias}, block{i}.fc_proj.{weight,bias},
and ln_f.{weight,bias}.
"""
import math
import sys

import h5py
import torch
import torch.nn.functional as F

V, VP, T, L, H, C, B = 61, 64, 16, 2, 2, 32, 4
LR, BETA1, BETA2, EPS, WD, STEPS, LN_EPS = 1e-3, 0.9, 0.999, 1e-8, 0.1, 10, 1e-5


def make_params():
    g = torch.Generator().manual_seed(0)

    def normal(*shape, std=0.02, mean=0.0):
        return (torch.randn(*shape, generator=g) * std + mean).float()

    p = {}
    wte = normal(VP, C)
    wte[V:] = 0  # padding rows, as llm.c
    p["embed.wte"] = wte
    p["embed.wpe"] = normal(T, C, std=0.01)
    for i in range(L):
        b = f"block{i}."
        p[b + "ln1.weight"] = normal(C, std=0.1, mean=1.0)
        p[b + "ln1.bias"] = normal(C, std=0.1)
        p[b + "qkv.weight"] = normal(3 * C, C, std=0.2)
        p[b + "qkv.bias"] = normal(3 * C, std=0.1)
        p[b + "attn_proj.weight"] = normal(C, C, std=0.2)
        p[b + "attn_proj.bias"] = normal(C, std=0.1)
        p[b + "ln2.weight"] = normal(C, std=0.1, mean=1.0)
        p[b + "ln2.bias"] = normal(C, std=0.1)
        p[b + "fc.weight"] = normal(4 * C, C, std=0.2)
        p[b + "fc.bias"] = normal(4 * C, std=0.1)
        p[b + "fc_proj.weight"] = normal(C, 4 * C, std=0.1)
        p[b + "fc_proj.bias"] = normal(C, std=0.1)
    p["ln_f.weight"] = normal(C, std=0.1, mean=1.0)
    p["ln_f.bias"] = normal(C, std=0.1)
    tokens = torch.randint(0, V, (B, T), generator=g, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=g, dtype=torch.int64)
    return p, tokens, targets


def decays(name):
    return name.endswith(".weight") and not (".ln" in name or name.startswith("ln_f"))


def forward(p, tokens, targets):
    x = p["embed.wte"][tokens] + p["embed.wpe"][torch.arange(T)]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    hs = C // H
    for i in range(L):
        b = f"block{i}."
        h = F.layer_norm(x, (C,), p[b + "ln1.weight"], p[b + "ln1.bias"], LN_EPS)
        qkv = F.linear(h, p[b + "qkv.weight"], p[b + "qkv.bias"])
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, H, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, p[b + "attn_proj.weight"], p[b + "attn_proj.bias"])
        h = F.layer_norm(x, (C,), p[b + "ln2.weight"], p[b + "ln2.bias"], LN_EPS)
        h = F.gelu(F.linear(h, p[b + "fc.weight"], p[b + "fc.bias"]), approximate="tanh")
        x = x + F.linear(h, p[b + "fc_proj.weight"], p[b + "fc_proj.bias"])
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], LN_EPS)
    logits = x @ p["embed.wte"].t()  # [B, T, VP]
    loss = F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))
    return logits, loss


def main(out):
    p32, tokens, targets = make_params()
    p = {k: v.double().requires_grad_(True) for k, v in p32.items()}
    logits, loss = forward(p, tokens, targets)
    loss.backward()
    grads = {k: v.grad.detach().clone() for k, v in p.items()}

    # AdamW as ringtrain's (and PyTorch's): decoupled decay on the Linear weights only.
    q = {k: v.detach().clone().requires_grad_(True) for k, v in p.items()}
    groups = [
        {"params": [q[k] for k in q if decays(k)], "weight_decay": WD},
        {"params": [q[k] for k in q if not decays(k)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(BETA1, BETA2), eps=EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        _, l = forward(q, tokens, targets)
        l.backward()
        opt.step()
        losses.append(l.item())

    with h5py.File(out, "w") as f:
        for k, v in dict(vocab_size=V, padded_vocab_size=VP, seq_len=T, n_layer=L, n_head=H,
                         n_embd=C, batch=B, lr=LR, beta1=BETA1, beta2=BETA2, eps=EPS,
                         weight_decay=WD, steps=STEPS, ln_eps=LN_EPS).items():
            f.attrs[k] = v
        f["tokens"] = tokens.int().numpy()
        f["targets"] = targets.int().numpy()
        for k, v in p32.items():
            d = f.create_dataset("params/" + k, data=v.double().numpy())
            d.attrs["decay"] = int(decays(k))
        f["logits"] = logits.detach().numpy()
        f["loss"] = loss.item()
        for k, v in grads.items():
            f["grads/" + k] = v.numpy()
        f["losses"] = torch.tensor(losses, dtype=torch.float64).numpy()
    print(f"{out}: loss {loss.item():.6f}, losses {losses[0]:.6f} .. {losses[-1]:.6f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/ref/gpt_ref.h5")
