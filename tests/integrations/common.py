"""Helpers of the framework-callback tests: a small tolerant job on the torch backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

BEACON = bytes(32)


def small_job(**train: Any) -> Any:
    """Digits MLP 64-8-10, tolerant on torch, SGD Nesterov, step decay, clipping: 8 steps."""
    from dk.pol import default_job

    t: dict[str, Any] = {
        "momentum": 0.9,
        "nesterov": True,
        "schedule": "step",
        "step_size": 4,
        "gamma": 0.5,
        "clip_norm": 0.5,
    }
    t.update(train)
    job = default_job(
        mode="tolerant", hidden=[8], steps=8, interval=4, batch_size=16, tolerance=0.01, train=t
    )
    assert job.pol["backend"] == "torch"
    return job


def prove_and_verify(job: Any, run: Path) -> Any:
    """``dk prove`` then ``dk verify`` (every interval challenged); the report."""
    from tests.helpers import WORKER

    from dk.prover import prove_run
    from dk.verifier import verify_bundle

    bundle = prove_run(run, job, WORKER, run.parent / "bundle")
    return verify_bundle(bundle, job, beacon=BEACON, samples=1000)
