"""Generate ``vectors/exact/replay.json``: exact-mode replays (start, batches, end root).

Deterministic (fixed seeds); ``python -m vectors.gen exact``. Checked by
:mod:`dk.vectors.exact`. Invalid cases carry the root of the true end checkpoint with one
weight moved by one ulp.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dk.vectors import write_cases

CASES: list[tuple[str, dict[str, Any], dict[str, Any], str, int]] = [
    ("mlp relu, sgd momentum + weight decay, cross-entropy",
     {"arch": "mlp", "input_dim": 64, "hidden": [32], "output_dim": 10, "activation": "relu"},
     {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4}, "cross_entropy", 8),
    ("mlp gelu, adam, cross-entropy",
     {"arch": "mlp", "input_dim": 64, "hidden": [32, 16], "output_dim": 10, "activation": "gelu"},
     {"name": "adam", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0},
     "cross_entropy", 8),
    ("linear, plain sgd, mse on one-hot labels",
     {"arch": "linear", "input_dim": 64, "output_dim": 10},
     {"name": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}, "mse", 8),
    ("cnn 1x8x8 (digits), sgd momentum, cross-entropy",
     {"arch": "cnn", "input_shape": [1, 8, 8], "output_dim": 10},
     {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0}, "cross_entropy", 8),
]  # fmt: skip


def _batches(model: dict[str, Any], seed: int, n: int, steps: int = 2) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    shape = [n, *model.get("input_shape", [model.get("input_dim")])]
    out = []
    for _ in range(steps):
        x = rng.standard_normal(shape).astype("<f4")
        y = rng.integers(0, model["output_dim"], n)
        out.append({"shape": shape, "x": x.tobytes().hex(), "y": [int(v) for v in y]})
    return out


def generate(root: Path) -> None:
    """Write ``root/exact/replay.json``."""
    from dk.pol.checkpoint import checkpoint_root
    from dk.pol.exact import ExactTrainer
    from dk.pol.models import init_params
    from dk.vectors.exact import exact_tensors, replay_root

    cases = []
    for i, (comment, model, opt, loss, n) in enumerate(CASES):
        base = {"model": model, "optimizer": opt, "loss": loss, "init_seed": 100 + i,
                "batches": _batches(model, 1000 + i, n)}  # fmt: skip
        start, end = replay_root(base)
        cases.append({"tcId": len(cases) + 1, "comment": comment, "result": "valid", **base,
                      "start_root": start.hex(), "expected_root": end.hex()})  # fmt: skip
        tr = ExactTrainer(model, opt, loss)
        params, state = init_params(model, 100 + i), {}
        for b in base["batches"]:
            x = np.frombuffer(bytes.fromhex(b["x"]), "<f4").reshape(b["shape"]).copy()
            tr.step(params, state, x, np.asarray(b["y"], dtype=np.int64))
        w = params[sorted(params)[-1]].reshape(-1)
        w[0] = np.nextafter(w[0], np.float32(np.inf))
        bad = checkpoint_root(exact_tensors(params, state)).hex()
        cases.append({"tcId": len(cases) + 1, "comment": comment + ": end checkpoint one ulp off",
                      "result": "invalid", "expected_reason": "REPLAY_MISMATCH", **base,
                      "start_root": start.hex(), "expected_root": bad})  # fmt: skip
    write_cases(root / "exact" / "replay.json", "exact_replay", cases)
