"""A small byte-level decoder-only transformer (GPT-style) and its data, for bench/torch/transformer.py.

Model: token embedding (vocabulary 256, the bytes) + learned position embedding, `layers`
pre-LayerNorm blocks (causal self-attention with `heads` heads, GELU MLP of 4 x d_model),
a final LayerNorm and an output head tied to the token embedding. Weights N(0, 0.02), the
residual projections N(0, 0.02 / sqrt(2 layers)) (GPT-2's scheme), biases 0, LayerNorms 1/0.

Data: the English text of Debian's `fortunes` package (/usr/share/games/fortunes/*, the
fortune files, not their .dat indexes), split into fortunes at the "%" lines; a fixed
fraction of the fortunes, chosen by a seeded permutation, is the validation text, the rest
the training text. Both are byte strings (UTF-8 as installed).
"""
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

FORTUNES_DIR = "/usr/share/games/fortunes"


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, layers=4, d_model=256, heads=4, context=128, vocab=256):
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList([Block(d_model, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d_model)
        # A plain attribute, not a buffer: DDP would broadcast a buffer (and Gloo has no bool).
        self.mask = torch.triu(torch.ones(context, context, dtype=torch.bool), 1)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.ln_f(x) @ self.tok.weight.t()  # tied output head

    def init_weights(self, seed):
        gen = torch.Generator().manual_seed(seed)
        resid = 0.02 / math.sqrt(2 * len(self.blocks))
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif ".ln" in name or name.startswith("ln_"):
                    p.fill_(1.0)
                elif name.endswith("proj.weight") or name.endswith("out.weight"):
                    p.normal_(0.0, resid, generator=gen)
                else:
                    p.normal_(0.0, 0.02, generator=gen)
        return self


def param_groups(model, weight_decay):
    """AdamW groups as usual: decay on the matrices (Linear weights, embeddings), none on
    biases and LayerNorm weights."""
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def load_fortunes(directory=FORTUNES_DIR):
    """Every fortune of the package's text files (sorted by file name), as a list of bytes."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            "%s missing: `apt-get install fortunes` (scripts/install-deps installs it)" % directory)
    out = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            text = f.read()
        for piece in text.split(b"\n%\n"):
            piece = piece.strip(b"%\n")
            if piece:
                out.append(piece + b"\n")
    return out


def split_corpus(fortunes, val_fraction, split_seed):
    """(train bytes, validation bytes): a seeded permutation of the fortunes, the first
    val_fraction of it for validation; each side joined with "%\\n" separators as in the files."""
    perm = np.random.default_rng(split_seed).permutation(len(fortunes))
    n_val = max(1, int(round(len(fortunes) * val_fraction)))
    val = b"%\n".join(fortunes[i] for i in sorted(perm[:n_val]))
    train = b"%\n".join(fortunes[i] for i in sorted(perm[n_val:]))
    return np.frombuffer(train, dtype=np.uint8), np.frombuffer(val, dtype=np.uint8)
