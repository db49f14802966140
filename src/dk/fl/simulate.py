"""A seeded federated simulation on scikit-learn digits, for the robustness table (SPEC §VII.3).

``n`` clients hold IID shards of the training split; each round every client runs
``local_steps`` SGD steps of a small torch MLP from the global weights and sends
``w_local - w_global``; ``f`` of them are malicious (an attack of :mod:`dk.fl.attacks`); the
coordinator aggregates and adds the result. FLTrust's coordinator trains on its own root
dataset (``root_size`` samples disjoint from the clients'). A *lazy* client sends a fabricated
update of the honest updates' size without training; with ``pol_gate`` the coordinator drops
every client whose bundle did not verify before aggregating.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dk.fl.aggregators import make_aggregator
from dk.fl.attacks import MODEL_ATTACKS


@dataclass(frozen=True)
class SimConfig:
    """Federated digits set-up (defaults: the benchmark's)."""

    n: int = 10
    f: int = 2
    rounds: int = 30
    local_steps: int = 10
    lr: float = 0.1
    batch_size: int = 32
    hidden: int = 32
    root_size: int = 100
    test_size: int = 297
    seed: int = 0


def _data(cfg: SimConfig) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    from sklearn.datasets import load_digits

    d = load_digits()
    X = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(cfg.seed))
    X, y = X[perm], y[perm]
    out = {"test": (X[: cfg.test_size], y[: cfg.test_size])}
    rest = slice(cfg.test_size, cfg.test_size + cfg.root_size)
    out["root"] = (X[rest], y[rest])
    Xc, yc = X[cfg.test_size + cfg.root_size :], y[cfg.test_size + cfg.root_size :]
    for i, idx in enumerate(torch.arange(len(yc)).chunk(cfg.n)):
        out[f"c{i}"] = (Xc[idx], yc[idx])
    return out


def _model(cfg: SimConfig) -> nn.Module:
    torch.manual_seed(cfg.seed)
    return nn.Sequential(nn.Linear(64, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, 10))


def _local(
    model: nn.Module,
    w: torch.Tensor,
    data: tuple[torch.Tensor, torch.Tensor],
    cfg: SimConfig,
    gen: torch.Generator,
) -> torch.Tensor:
    nn.utils.vector_to_parameters(w.clone(), model.parameters())  # copy: it aliases w
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    X, y = data
    for _ in range(cfg.local_steps):
        idx = torch.randint(len(y), (cfg.batch_size,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(model(X[idx]), y[idx]).backward()
        opt.step()
    return nn.utils.parameters_to_vector(model.parameters()).detach() - w


def accuracy(model: nn.Module, w: torch.Tensor, data: tuple[torch.Tensor, torch.Tensor]) -> float:
    """Top-1 accuracy of the weights ``w`` on ``data``."""
    nn.utils.vector_to_parameters(w.clone(), model.parameters())  # copy: it aliases w
    with torch.no_grad():
        return float((model(data[0]).argmax(1) == data[1]).float().mean())


def run_digits(
    aggregator: str,
    attack: str = "none",
    *,
    cfg: SimConfig = SimConfig(),
    pol_gate: Callable[[int], bool] | None = None,
    backend: str = "fast",
) -> float:
    """Test accuracy after ``cfg.rounds`` rounds with ``aggregator`` under ``attack``.

    Args:
        aggregator: a name of :data:`dk.fl.aggregators.AGGREGATORS`.
        attack: a name of :data:`dk.fl.attacks.ATTACKS`; clients ``0..f-1`` are malicious.
        cfg: the set-up.
        pol_gate: ``pol_gate(i)`` is True when client ``i``'s bundle verified; others are dropped
            before aggregation (None: no gate).
        backend: ``fast`` (torch) or ``reference`` (NumPy) aggregation rules.
    """
    data = _data(cfg)
    model = _model(cfg)
    w = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    bad = list(range(cfg.f)) if attack != "none" else []
    agg = make_aggregator(aggregator, f=cfg.f, backend=backend)
    rng = np.random.default_rng(cfg.seed)
    gens = [torch.Generator().manual_seed(cfg.seed * 1000 + i) for i in range(cfg.n + 1)]
    for _ in range(cfg.rounds):
        ups = []
        for i in range(cfg.n):
            X, y = data[f"c{i}"]
            if attack in ("label_flip", "scaling") and i in bad:
                y = 9 - y
            ups.append(_local(model, w, (X, y), cfg, gens[i]).numpy())
        u = np.stack(ups).astype(np.float64)
        if attack == "lazy":  # fabricated, untrained updates of the honest size
            rms = float(np.sqrt(np.mean(np.delete(u, bad, axis=0) ** 2)))
            u[bad] = rng.normal(0.0, rms, size=(len(bad), u.shape[1]))
        u = MODEL_ATTACKS[attack](u, bad, rng)
        keep = [i for i in range(cfg.n) if pol_gate is None or pol_gate(i)]
        root = _local(model, w, data["root"], cfg, gens[cfg.n]).numpy() if agg.needs_root else None
        step = agg(u[keep], root=root)
        w = w + torch.as_tensor(step, dtype=torch.float32)
    return accuracy(model, w, data["test"])
