#!/usr/bin/python3
"""Reference values for the Llama parity test (tests/unit/test_llama_parity.cpp), computed with
PyTorch (an independent implementation, written as Hugging Face's LlamaForCausalLM computes:
rotate_half rotary embeddings, repeat_kv grouped-query attention, SwiGLU MLP, RMS norms) and
written to an HDF5 file that the C++ test reads.

    /usr/bin/python3 tests/ref/make_llama_ref.py tests/ref/llama_ref.h5 [--pairing interleaved]

Needs Debian's python3-torch and python3-h5py. Deterministic (torch.manual_seed(0)): the
parameters and tokens are drawn once in float32, then everything is computed in float64 from
those values and stored as float64 (tokens int32). --pairing interleaved writes a deliberately
wrong reference (Meta's original pairing of dimensions 2i and 2i+1), which the test must fail.

The model is models/llama-tiny.pbtxt at a tiny size: vocabulary 61 padded to 64 (the padded
logits take no part in the softmax), T = 16, 2 layers, 4 heads of 8 (width 32), ffn 48, theta
10000, RMS norm eps 1e-5, untied head; once per kv_heads in 1, 2, 4 (multi-query, grouped,
multi-head), each under /kv{K}/.

Layout (per /kv{K}/):
  attrs: kv_heads
  /params/NAME   initial values (ringtrain's names: embed_tokens.wte, layers.{i}.self_attn.q_proj.weight, ...)
  /logits        [batch, seq_len, padded_vocab_size]
  /loss          scalar: mean token cross-entropy
  /grads/NAME    gradient of /loss for each parameter
Root attrs: vocab_size padded_vocab_size seq_len n_layer n_head n_embd ffn batch rope_theta
norm_eps; /tokens, /targets int32 [batch, seq_len].
"""
import math
import sys

import h5py
import torch
import torch.nn.functional as F

V, VP, T, L, H, C, FFN, B = 61, 64, 16, 2, 4, 32, 48, 2
THETA, EPS = 10000.0, 1e-5
D = C // H


def make_params(kv, g):
    def normal(*shape, std=0.2, mean=0.0):
        return (torch.randn(*shape, generator=g) * std + mean).float()

    p = {}
    wte = normal(VP, C, std=0.5)
    wte[V:] = 0
    p["embed_tokens.wte"] = wte
    for i in range(L):
        b = f"layers.{i}."
        p[b + "input_layernorm.weight"] = normal(C, std=0.1, mean=1.0)
        p[b + "self_attn.q_proj.weight"] = normal(C, C, std=0.3)
        p[b + "self_attn.k_proj.weight"] = normal(kv * D, C, std=0.3)
        p[b + "self_attn.v_proj.weight"] = normal(kv * D, C)
        p[b + "self_attn.o_proj.weight"] = normal(C, C)
        p[b + "post_attention_layernorm.weight"] = normal(C, std=0.1, mean=1.0)
        p[b + "mlp.gate_proj.weight"] = normal(FFN, C)
        p[b + "mlp.up_proj.weight"] = normal(FFN, C)
        p[b + "mlp.down_proj.weight"] = normal(C, FFN)
    p["norm.weight"] = normal(C, std=0.1, mean=1.0)
    p["lm_head.weight"] = normal(VP, C)
    return p


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rotate_half(x):  # HF Llama: dimension i pairs with i + d/2
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope(x, pairing):
    inv_freq = THETA ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [T, D/2]
    if pairing == "interleaved":  # Meta's original: dimension 2i pairs with 2i + 1
        xr = x.view(*x.shape[:-1], D // 2, 2)
        a, b = xr[..., 0], xr[..., 1]
        c, s = ang.cos(), ang.sin()
        return torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)
    emb = torch.cat((ang, ang), dim=-1)
    return x * emb.cos() + rotate_half(x) * emb.sin()


def forward(p, tokens, targets, kv, pairing):
    x = p["embed_tokens.wte"][tokens]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(L):
        b = f"layers.{i}."
        h = rms_norm(x, p[b + "input_layernorm.weight"])
        q = F.linear(h, p[b + "self_attn.q_proj.weight"]).view(B, T, H, D).transpose(1, 2)
        k = F.linear(h, p[b + "self_attn.k_proj.weight"]).view(B, T, kv, D).transpose(1, 2)
        v = F.linear(h, p[b + "self_attn.v_proj.weight"]).view(B, T, kv, D).transpose(1, 2)
        q, k = rope(q, pairing), rope(k, pairing)
        k = k.repeat_interleave(H // kv, dim=1)  # HF's repeat_kv
        v = v.repeat_interleave(H // kv, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, p[b + "self_attn.o_proj.weight"])
        h = rms_norm(x, p[b + "post_attention_layernorm.weight"])
        m = F.silu(F.linear(h, p[b + "mlp.gate_proj.weight"])) * F.linear(h, p[b + "mlp.up_proj.weight"])
        x = x + F.linear(m, p[b + "mlp.down_proj.weight"])
    x = rms_norm(x, p["norm.weight"])
    logits = F.linear(x, p["lm_head.weight"])
    loss = F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))
    return logits, loss


def main(out, pairing):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, V, (B, T), generator=g, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=g, dtype=torch.int64)
    with h5py.File(out, "w") as f:
        for k, v in dict(vocab_size=V, padded_vocab_size=VP, seq_len=T, n_layer=L, n_head=H,
                         n_embd=C, ffn=FFN, batch=B, rope_theta=THETA, norm_eps=EPS).items():
            f.attrs[k] = v
        f["tokens"] = tokens.int().numpy()
        f["targets"] = targets.int().numpy()
        for kv in (1, 2, 4):
            p32 = make_params(kv, g)
            p = {k: v.double().requires_grad_(True) for k, v in p32.items()}
            logits, loss = forward(p, tokens, targets, kv, pairing)
            loss.backward()
            grp = f.create_group(f"kv{kv}")
            grp.attrs["kv_heads"] = kv
            for k, v in p32.items():
                grp["params/" + k] = v.double().numpy()
                grp["grads/" + k] = p[k].grad.numpy()
            grp["logits"] = logits.detach().numpy()
            grp["loss"] = loss.item()
            print(f"{out}: kv_heads {kv}: loss {loss.item():.6f}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    pairing = "interleaved" if "--pairing" in sys.argv else "half"
    if "--pairing" in sys.argv:
        pairing = sys.argv[sys.argv.index("--pairing") + 1]
        args = [a for a in args if a != pairing]
    main(args[0] if args else "tests/ref/llama_ref.h5", pairing)
