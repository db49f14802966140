"""Small example models and a training loop for the rounded backend's tests and benchmarks.

``mlp``: a 256-``width``-10 GELU MLP trained by SGD with momentum; ``resnet``: a residual conv
net with BatchNorm trained by SGD with momentum; ``lm``: a 2-layer transformer language model
(pre-norm, causal attention) trained by AdamW with gradient clipping. ``width`` scales each.
Everything is seeded; nothing here is part of a format.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class _Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(h)))


class ResNet(nn.Module):
    """Stem conv + BN, two residual blocks, global average pool, linear head."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.blocks = nn.Sequential(_Block(width), _Block(width))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(F.relu(self.bn(self.stem(x))))
        out: torch.Tensor = self.head(h.mean(dim=(2, 3)))
        return out


class TinyLM(nn.Module):
    """A 2-layer pre-norm transformer LM with causal self-attention."""

    mask: torch.Tensor  # a registered buffer (nn.Module.__getattr__ is typed Tensor | Module)

    def __init__(self, width: int = 64, vocab: int = 96, seq: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(seq, width) * 0.02)
        layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, activation="gelu", batch_first=True,
            norm_first=True,
        )  # fmt: skip
        self.layers = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos[: x.shape[1]]
        h = self.layers(h, mask=self.mask[: x.shape[1], : x.shape[1]], is_causal=True)
        out: torch.Tensor = self.out(self.norm(h))
        return out


def build(
    kind: str, *, seed: int, width: int, batch: int, device: str = "cpu", foreach: bool = False
) -> dict[str, Any]:
    """Model, optimizer and a ``step(i)`` closure for example ``kind`` (mlp, resnet, lm).

    The weights and data are drawn on the CPU from ``seed`` and moved to ``device``, so every
    device starts from the same bits; the optimizers run their per-tensor loops
    (``foreach=False``, the implementation torch picks on the CPU) on every device unless
    ``foreach`` asks for the list forms (``_foreach_*``, torch's default on CUDA).
    """
    torch.manual_seed(seed)
    gen = np.random.default_rng(seed)
    model: nn.Module
    opt: torch.optim.Optimizer
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(256, width), nn.GELU(), nn.Linear(width, 10))
        model.to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=foreach)
        xm = torch.from_numpy(gen.standard_normal((4, batch, 256)).astype(np.float32)).to(device)
        ym = torch.from_numpy(gen.integers(0, 10, (4, batch))).to(device)

        def loss_of(i: int) -> torch.Tensor:
            return F.cross_entropy(model(xm[i % 4]), ym[i % 4])

        clip = None
    elif kind == "resnet":
        model = ResNet(width).to(device)
        opt = torch.optim.SGD(
            model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4, foreach=foreach
        )
        x = torch.from_numpy(gen.standard_normal((4, batch, 3, 16, 16)).astype(np.float32))
        x = x.to(device)
        y = torch.from_numpy(gen.integers(0, 10, (4, batch))).to(device)

        def loss_of(i: int) -> torch.Tensor:
            return F.cross_entropy(model(x[i % 4]), y[i % 4])

        clip = None
    elif kind == "lm":
        model = TinyLM(width).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, foreach=foreach)
        toks = torch.from_numpy(gen.integers(0, 96, (4, batch, 33))).to(device)

        def loss_of(i: int) -> torch.Tensor:
            t = toks[i % 4]
            return F.cross_entropy(model(t[:, :-1]).reshape(-1, 96), t[:, 1:].reshape(-1))

        clip = 1.0
    else:
        raise ValueError(f"unknown example {kind!r}")

    def step(i: int) -> float:
        opt.zero_grad(set_to_none=True)
        loss = loss_of(i)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward untyped
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return float(loss.detach())

    return {"model": model, "opt": opt, "step": step}


def state_tensors(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    """Checkpoint tensors (``model/…``, ``optim/<param>/<state>``) of a torch training state."""
    out = {f"model/{k}": v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, st in opt.state.items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                out[f"optim/{names[id(p)]}/{k}"] = v.detach().cpu().numpy().copy()
    return out


def train(built: dict[str, Any], steps: range, wrap: Callable[[], Any] | None = None) -> None:
    """Run ``steps`` of an example, optionally inside the context ``wrap()`` returns."""
    if wrap is None:
        for i in steps:
            built["step"](i)
        return
    with wrap():
        for i in steps:
            built["step"](i)
