"""Robust aggregation rules, NumPy references (SPEC §VII.3).

Each rule maps client updates ``U`` (``n × d`` float, one row per client) to one update.
References are written for clarity (loops in float64); :mod:`dk.fl.robust_fast` holds the
vectorised torch twins with the same signatures, tested against these.

* ``fedavg``: the (weighted) mean (McMahan et al. 2017).
* ``median``: coordinate-wise median; the mean of the two middle values when ``n`` is even
  (Yin et al. 2018).
* ``trimmed_mean``: coordinate-wise mean after dropping the ``b`` lowest and ``b`` highest
  values (Yin et al. 2018).
* ``krum`` / multi-Krum: score each update by the sum of squared distances to its
  ``n - f - 2`` nearest others; average the ``m`` lowest-scored (``m = 1``: Krum; ties go to the
  lower index) (Blanchard et al. 2017).
* ``fltrust``: trust score ``ReLU(cos(u_i, g0))`` against the coordinator's update ``g0`` on its
  root dataset; each ``u_i`` rescaled to ``‖g0‖``; the trust-weighted mean (Cao et al. 2021).
"""

from __future__ import annotations

import math

import numpy as np


def _rows(updates: np.ndarray) -> np.ndarray:
    u = np.asarray(updates, dtype=np.float64)
    if u.ndim != 2 or u.shape[0] == 0:
        raise ValueError("updates must be a non-empty (n, d) array")
    return u


def fedavg_reference(updates: np.ndarray, *, weights: np.ndarray | None = None) -> np.ndarray:
    """Weighted mean of the rows (``weights`` default: equal)."""
    u = _rows(updates)
    w = np.ones(u.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
    out = np.zeros(u.shape[1])
    for i in range(u.shape[0]):
        out += w[i] * u[i]
    return out / w.sum()


def median_reference(updates: np.ndarray) -> np.ndarray:
    """Coordinate-wise median."""
    return np.median(_rows(updates), axis=0)


def trimmed_mean_reference(updates: np.ndarray, *, b: int) -> np.ndarray:
    """Coordinate-wise mean without the ``b`` smallest and ``b`` largest values."""
    u = _rows(updates)
    if not 0 <= 2 * b < u.shape[0]:
        raise ValueError(f"trimmed mean: cannot trim 2·{b} of {u.shape[0]} values")
    out = np.empty(u.shape[1])
    for j in range(u.shape[1]):
        col = sorted(u[:, j])
        out[j] = sum(col[b : u.shape[0] - b]) / (u.shape[0] - 2 * b)
    return out


def krum_scores_reference(updates: np.ndarray, *, f: int) -> np.ndarray:
    """Krum score of each row: the sum of its ``n - f - 2`` smallest squared distances."""
    u = _rows(updates)
    n = u.shape[0]
    k = n - f - 2
    if k < 1:
        raise ValueError(f"krum needs n > f + 2, got n={n}, f={f}")
    scores = np.empty(n)
    for i in range(n):
        d = sorted(float(np.sum((u[i] - u[j]) ** 2)) for j in range(n) if j != i)
        scores[i] = sum(d[:k])
    return scores


def krum_reference(updates: np.ndarray, *, f: int, m: int = 1) -> np.ndarray:
    """Mean of the ``m`` rows with the lowest Krum scores (``m = 1``: Krum)."""
    u = _rows(updates)
    scores = krum_scores_reference(u, f=f)
    chosen = sorted(range(u.shape[0]), key=lambda i: (scores[i], i))[:m]
    return u[chosen].mean(axis=0)


def fltrust_reference(updates: np.ndarray, *, root: np.ndarray) -> np.ndarray:
    """FLTrust: trust-weighted mean of the rows rescaled to ``‖root‖``."""
    u = _rows(updates)
    g0 = np.asarray(root, dtype=np.float64)
    n0 = math.sqrt(float(np.sum(g0 * g0)))
    out, total = np.zeros(u.shape[1]), 0.0
    for i in range(u.shape[0]):
        ni = math.sqrt(float(np.sum(u[i] * u[i])))
        if ni == 0.0 or n0 == 0.0:
            continue
        ts = max(0.0, float(np.sum(u[i] * g0)) / (ni * n0))
        out += ts * (n0 / ni) * u[i]
        total += ts
    return out / total if total > 0 else out
