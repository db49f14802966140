"""Compressed training of a small MLP on scikit-learn's digits (benchmark and smoke test).

The whole gradient is flattened into one bucket, as DDP does, compressed with
:class:`~dk.compress.state.CompressedSGDStep` and the decompression fed to plain SGD.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from dk.compress.state import CompressedSGDStep


@dataclass(frozen=True)
class DigitsResult:
    """Outcome of one training run."""

    spec: str
    accuracy: float
    wire_bytes: int
    dense_bytes: int

    @property
    def ratio(self) -> float:
        """Dense float32 gradient bytes over compressed wire bytes."""
        return self.dense_bytes / self.wire_bytes


def _data(seed: int) -> tuple[torch.Tensor, ...]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    perm = np.random.default_rng(seed).permutation(len(y))
    x = torch.from_numpy((x[perm] / 16.0).astype(np.float32))
    y = torch.from_numpy(y[perm].astype(np.int64))
    return x[:1437], y[:1437], x[1437:], y[1437:]


def train_digits(
    spec: str, *, steps: int = 600, batch: int = 32, lr: float = 0.1, seed: int = 0
) -> DigitsResult:
    """Train a 64-64-10 MLP with compressed gradients; return test accuracy and bytes.

    Args:
        spec: codec spec string (``"none"`` for dense).
        steps: SGD steps.
        batch: batch size.
        lr: learning rate (plain SGD).
        seed: data split, initial weights and batch order.

    Returns:
        The :class:`DigitsResult`.
    """
    torch.manual_seed(seed)
    xtr, ytr, xte, yte = _data(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    params = list(model.parameters())
    step = CompressedSGDStep(spec)
    order = np.random.default_rng(seed + 1)
    wire = dense = 0
    for _ in range(steps):
        idx = torch.from_numpy(order.integers(0, len(ytr), batch))
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
        flat = torch.cat([cast(torch.Tensor, p.grad).reshape(-1) for p in params]).numpy()
        new = step.step({"bucket0": flat})["bucket0"]
        wire += step.last_wire_bytes
        dense += step.last_dense_bytes
        with torch.no_grad():
            off = 0
            for p in params:
                p.sub_(lr * torch.from_numpy(new[off : off + p.numel()]).view_as(p))
                off += p.numel()
    with torch.no_grad():
        acc = float((model(xte).argmax(1) == yte).float().mean())
    return DigitsResult(spec, acc, wire, dense)
