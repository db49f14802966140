"""Vectorised torch twins of :mod:`dk.fl.robust` (same signatures; float64 on CPU)."""

from __future__ import annotations

import numpy as np
import torch


def _t(updates: np.ndarray) -> torch.Tensor:
    u = torch.as_tensor(np.asarray(updates), dtype=torch.float64)
    if u.ndim != 2 or u.shape[0] == 0:
        raise ValueError("updates must be a non-empty (n, d) array")
    return u


def fedavg_fast(updates: np.ndarray, *, weights: np.ndarray | None = None) -> np.ndarray:
    """Twin of :func:`dk.fl.robust.fedavg_reference`."""
    u = _t(updates)
    w = torch.ones(u.shape[0], dtype=torch.float64) if weights is None else _w(weights)
    return ((w[:, None] * u).sum(0) / w.sum()).numpy()


def _w(weights: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(weights), dtype=torch.float64)


def median_fast(updates: np.ndarray) -> np.ndarray:
    """Twin of :func:`dk.fl.robust.median_reference`."""
    s = torch.sort(_t(updates), dim=0).values
    n = s.shape[0]
    mid = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    return mid.numpy()


def trimmed_mean_fast(updates: np.ndarray, *, b: int) -> np.ndarray:
    """Twin of :func:`dk.fl.robust.trimmed_mean_reference`."""
    u = _t(updates)
    if not 0 <= 2 * b < u.shape[0]:
        raise ValueError(f"trimmed mean: cannot trim 2·{b} of {u.shape[0]} values")
    return torch.sort(u, dim=0).values[b : u.shape[0] - b].mean(0).numpy()


def krum_scores_fast(updates: np.ndarray, *, f: int) -> np.ndarray:
    """Twin of :func:`dk.fl.robust.krum_scores_reference` (distances from one Gram matrix)."""
    u = _t(updates)
    n = u.shape[0]
    k = n - f - 2
    if k < 1:
        raise ValueError(f"krum needs n > f + 2, got n={n}, f={f}")
    sq = (u * u).sum(1)
    d2 = (sq[:, None] + sq[None, :] - 2 * (u @ u.T)).clamp_min(0)
    d2.fill_diagonal_(float("inf"))
    return torch.sort(d2, dim=1).values[:, :k].sum(1).numpy()


def krum_fast(updates: np.ndarray, *, f: int, m: int = 1) -> np.ndarray:
    """Twin of :func:`dk.fl.robust.krum_reference`."""
    u = np.asarray(updates, dtype=np.float64)
    scores = krum_scores_fast(u, f=f)
    chosen = np.lexsort((np.arange(u.shape[0]), scores))[:m]
    return _t(u)[torch.as_tensor(chosen)].mean(0).numpy()


def fltrust_fast(updates: np.ndarray, *, root: np.ndarray) -> np.ndarray:
    """Twin of :func:`dk.fl.robust.fltrust_reference`."""
    u = _t(updates)
    g0 = torch.as_tensor(np.asarray(root), dtype=torch.float64)
    n0 = g0.norm()
    ni = u.norm(dim=1)
    ok = (ni > 0) & (n0 > 0)
    ts = torch.where(ok, torch.relu(u @ g0 / (ni * n0).where(ok, 1.0)), 0.0)
    scaled = u * torch.where(ok, n0 / ni.where(ok, 1.0), 0.0)[:, None]
    total = ts.sum()
    out = (ts[:, None] * scaled).sum(0)
    return (out / total if total > 0 else out).numpy()
