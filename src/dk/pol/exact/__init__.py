"""Exact mode: reproducible float32 training kernels (SPEC II).

Every reduction has a fixed order, no multiply is fused into an add, and ``exp``/``log``/``erf``
are computed with fixed arithmetic, so one training step gives the same bits on any thread
count (tested) and, by construction, across CPUs and CUDA GPUs (tested on x86-64 only: arm64
and a real GPU are untested, SPEC II §1; the CUDA kernels are checked under Numba's simulator).
Numba is imported only when a trainer is built.

>>> from dk.pol.exact import ExactTrainer
>>> tr = ExactTrainer({"arch": "linear", "input_dim": 4, "output_dim": 2},
...                   {"name": "sgd", "lr": 0.1}, "cross_entropy")
>>> tr.param_shapes()
{'fc0.weight': (2, 4), 'fc0.bias': (2,)}
"""

from __future__ import annotations

from typing import Any

from dk.pol.exact.trainer import ExactTrainer as ExactTrainer

__all__ = ["ExactTrainer", "reference_step"]


def __getattr__(name: str) -> Any:
    # The float64 reference serves tests and vectors; a replay never loads it (a fixed cost).
    if name == "reference_step":
        from dk.pol.exact.reference import reference_step

        return reference_step
    raise AttributeError(f"module 'dk.pol.exact' has no attribute {name!r}")
