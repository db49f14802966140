"""Builders shared by the test suite (tiny jobs and bundles)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dk.crypto.keys import SigningKey

WORKER = SigningKey(bytes(range(32)))


def tiny_job(**kw: Any) -> Any:
    """A fast exact-mode digits job: MLP 64-8-10, 20 steps, checkpoints every 5."""
    from dk.pol import default_job

    args: dict[str, Any] = dict(hidden=[8], steps=20, interval=5, batch_size=16)
    args.update(kw)
    return default_job(**args)


def make_bundle(tmp: Path, job: Any = None, key: SigningKey = WORKER) -> tuple[Any, Path]:
    """Train, record and prove ``job`` (default: :func:`tiny_job`); returns (job, bundle)."""
    from dk.pol import train_job
    from dk.prover import prove_run

    job = job if job is not None else tiny_job()
    train_job(job, tmp / "run")
    return job, prove_run(tmp / "run", job, key, tmp / "bundle")
