"""Generate ``vectors/exact/``: exact-mode replays and the elementwise functions (SPEC II §4).

``replay.json``: start, batches and end root of exact-mode replays; invalid cases carry the
root of the true end checkpoint with one weight moved by one ulp. ``elementwise.json``: the
bits of ``exp32``, ``log32`` and ``erf32`` on edge and random float32 inputs, computed by the
pure-Python programs of ``dk.pol.exact._math``; invalid cases are one ulp off.

Deterministic (fixed seeds); ``python -m vectors.gen exact``. Checked by
:mod:`dk.vectors.exact`.
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


F32 = np.float32


def _f32(values: list[float]) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def _edges(fn: str) -> np.ndarray:
    tiny, big = np.finfo(F32).smallest_subnormal, np.finfo(F32).max
    up, down = (
        (lambda v: np.nextafter(F32(v), F32(np.inf))),
        (lambda v: np.nextafter(F32(v), F32(-np.inf))),
    )
    common = [0.0, -0.0, np.nan, np.inf, -np.inf, 1.0, -1.0, 0.5, 1e-30, -1e-30, tiny, -tiny]
    if fn == "exp32":
        extra = [88.8, up(88.8), 88.72, 88.7, -104.0, down(-104.0), -103.9, -87.3, -100.0,
                 10.0, -10.0, 0.34657359, 0.6931472, -0.6931472, big, -big]  # fmt: skip
    elif fn == "log32":
        extra = [np.finfo(F32).tiny, down(np.finfo(F32).tiny), big, 1.4142135,
                 up(1.4142135), down(1.4142135), 2.0, np.e, 10.0, up(1.0), down(1.0),
                 2.0**-63, 2.0**64]  # fmt: skip
    else:
        extra = [down(1.0), 2.0, down(2.0), -2.0, 4.0, down(4.0), -4.0, 3.0, 1.5, 10.0,
                 -0.3, 0.8862269]  # fmt: skip
    return _f32(common + [float(v) for v in extra])


def _random(fn: str, n: int = 96) -> np.ndarray:
    rng = np.random.default_rng({"exp32": 11, "log32": 12, "erf32": 13}[fn])
    if fn == "exp32":
        return rng.uniform(-104.0, 88.8, n).astype(F32)
    if fn == "log32":
        return np.ldexp(rng.uniform(1.0, 2.0, n), rng.integers(-149, 128, n)).astype(F32)
    return rng.uniform(-5.0, 5.0, n).astype(F32)


def _apply(fn: str, xs: np.ndarray) -> np.ndarray:
    from dk.pol.exact import _math

    f = getattr(_math, fn)
    with np.errstate(over="ignore", under="ignore"):  # exp32 overflows to inf by design
        return _f32([float(f(F32(x))) for x in xs])


def elementwise_cases() -> list[dict[str, Any]]:
    """Cases of ``elementwise.json`` (SPEC II §4)."""
    from dk.pol.exact import _cpu

    cases: list[dict[str, Any]] = []
    for fn in ("exp32", "log32", "erf32"):
        for what, xs in (("edge inputs", _edges(fn)), ("seeded random inputs", _random(fn))):
            ys = _apply(fn, xs)
            kernel = _f32([float(getattr(_cpu, fn)(F32(x))) for x in xs])
            assert kernel.tobytes() == ys.tobytes(), fn  # the compiled kernel agrees
            cases.append({"tcId": len(cases) + 1, "comment": f"{fn}: {what}", "result": "valid",
                          "function": fn, "x": xs.astype("<f4").tobytes().hex(),
                          "y": ys.astype("<f4").tobytes().hex()})  # fmt: skip
        xs = _random(fn)[:3]
        ys = _apply(fn, xs)
        for x, y in zip(xs, ys, strict=True):
            off = np.nextafter(y, F32(np.inf))
            cases.append({"tcId": len(cases) + 1, "comment": f"{fn}: result one ulp off",
                          "result": "invalid", "expected_reason": "REPLAY_MISMATCH",
                          "function": fn, "x": _f32([x]).astype("<f4").tobytes().hex(),
                          "y": _f32([off]).astype("<f4").tobytes().hex()})  # fmt: skip
    return cases


def generate(root: Path) -> None:
    """Write ``root/exact/replay.json`` and ``root/exact/elementwise.json``."""
    write_cases(root / "exact" / "elementwise.json", "exact_elementwise", elementwise_cases())
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
