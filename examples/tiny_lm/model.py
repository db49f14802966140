"""The consumer's model file: a 2-layer causal transformer language model over bytes.

Dropout is ``dk.pol.augment.Dropout``: its masks come from dk's per-step generator (seeded from
the job's seed and the step), so a CUDA run and a CPU replay drop the same units.
"""

import torch
import torch.nn.functional as F
from torch import nn

from dk.pol.augment import Dropout


class Block(nn.Module):
    """Pre-norm attention and MLP, each followed by dropout on the residual branch."""

    def __init__(self, dim: int, heads: int, p: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.drop1, self.drop2 = Dropout(p), Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop1(self.out(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop2(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class TinyLM(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final norm and a linear head."""

    def __init__(self, vocab: int, dim: int, heads: int, layers: int, ctx: int, p: float):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, p) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def build(vocab=256, dim=64, heads=4, layers=2, ctx=64, dropout=0.1):
    """The factory the job names; kwargs come from ``model.kwargs``."""
    return TinyLM(vocab, dim, heads, layers, ctx, dropout)
