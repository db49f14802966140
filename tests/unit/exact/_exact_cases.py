"""Shared model / optimizer cases for the exact-mode step tests (also run in subprocesses)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from dk.pol.exact import ExactTrainer
from dk.pol.models import init_params

CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "mlp_relu_sgd": (
        {"arch": "mlp", "input_dim": 20, "hidden": [16, 12], "output_dim": 5, "activation": "relu"},
        {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3},
        "cross_entropy",
    ),
    "mlp_gelu_adam_mse": (
        {"arch": "mlp", "input_dim": 20, "hidden": [16], "output_dim": 5, "activation": "gelu"},
        {"name": "adam", "lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-2},
        "mse",
    ),
    "linear_adam": (
        {"arch": "linear", "input_dim": 20, "output_dim": 5},
        {"name": "adam", "lr": 1e-2, "betas": [0.9, 0.99], "eps": 1e-6, "weight_decay": 0.0},
        "cross_entropy",
    ),
    "cnn_sgd": (
        {"arch": "cnn", "input_shape": [1, 8, 8], "output_dim": 5},
        {"name": "sgd", "lr": 0.05, "momentum": 0.0, "weight_decay": 0.0},
        "cross_entropy",
    ),
}
TINY: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "mlp_gelu_sgd": (
        {"arch": "mlp", "input_dim": 6, "hidden": [5], "output_dim": 3, "activation": "gelu"},
        {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3},
        "cross_entropy",
    ),
    "mlp_relu_adam_mse": (
        {"arch": "mlp", "input_dim": 6, "hidden": [5], "output_dim": 3, "activation": "relu"},
        {"name": "adam", "lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-2},
        "mse",
    ),
    "cnn_sgd_momentum": (
        {"arch": "cnn", "input_shape": [1, 4, 4], "output_dim": 3},
        {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0},
        "cross_entropy",
    ),
}


def batch(model: dict[str, Any], n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A reproducible random batch for ``model``."""
    rng = np.random.default_rng(seed)
    shape = model.get("input_shape", [model.get("input_dim")])
    x = rng.standard_normal((n, *shape)).astype(np.float32)
    return x, rng.integers(0, int(model["output_dim"]), n).astype(np.int64)


def run(case: tuple, steps: int, n: int, seed: int, device: str = "cpu") -> dict[str, np.ndarray]:
    """Train ``steps`` steps from the registry init; returns params and state together."""
    model, opt, loss = case
    tr = ExactTrainer(model, opt, loss, device=device)
    params, state = init_params(model, seed), {}
    for s in range(steps):
        tr.step(params, state, *batch(model, n, seed * 1000 + s))
    return {**params, **state}


def compiled_kernels() -> Any:
    """The ahead-of-time kernels (``dk.pol.exact.aot``) for a test: skipped where this Numba has
    no ``numba.pycc`` (they cannot exist), a failure where ``make`` has not built them."""
    import importlib.util

    import pytest

    from dk.pol.exact import aot

    if importlib.util.find_spec("numba.pycc") is None:
        pytest.skip("this Numba has no numba.pycc: dk uses the JIT kernels only")
    mod = aot.load()
    if mod is None:
        pytest.fail("dk's ahead-of-time kernels are missing or stale: `make` builds them")
    return aot.AotKernels(mod)


def digest(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over names and raw bytes, in sorted name order."""
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode() + b"\0" + np.ascontiguousarray(arrays[k]).tobytes())
    return h.hexdigest()


if __name__ == "__main__":  # python _exact_cases.py: digests of every case and of 20 seeds
    import numba

    print("threads", numba.get_num_threads())
    for name, case in CASES.items():
        print(name, digest(run(case, 4, 64, seed=7)))
    for seed in range(20):
        print("seed", seed, digest(run(CASES["mlp_relu_sgd"], 2, 32, seed=seed)))
