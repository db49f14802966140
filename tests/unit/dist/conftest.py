"""Data-parallel test fixtures: a two-rank job, rank keys, and an in-process group."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import tiny_job

from dk.crypto.keys import SigningKey

KEYS = [SigningKey(bytes([r + 1]) * 32) for r in range(4)]


def dp_job(world_size: int = 2, compression: str = "", **kw: Any) -> Any:
    """The tiny digits job (20 steps, intervals of 5, batch 16) on ``world_size`` ranks."""
    job = tiny_job(**kw).with_updates(train={"world_size": world_size})
    if compression:  # checkpoint 0 then holds each rank's codec counter: re-pin its root
        from dk.pol.checkpoint import checkpoint_root, initial_checkpoint
        from dk.pol.data import load_dataset

        job = job.with_updates(train={"compression": compression}, pol={"init_root": ""})
        spe = len(load_dataset(job)) // job.train["batch_size"]
        root = checkpoint_root(initial_checkpoint(job, spe)).hex()
        job = job.with_updates(pol={"init_root": root})
    return job


def run_threads(
    job: Any, run_dir: Path, *, fault: Callable[..., Any] | None = None, fault_rank: int = 1
) -> None:
    """Train ``job`` on ``W`` thread ranks (rank 0 writes ``run_dir``); re-raise any error."""
    from dk.dist.local import train_threads

    train_threads(job, run_dir, KEYS, faults={fault_rank: fault} if fault else None)


@pytest.fixture(scope="module")
def honest_dp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """A proved honest two-rank bundle (thread ranks)."""
    from dk.prover import prove_run

    tmp = tmp_path_factory.mktemp("dp-honest")
    job = dp_job()
    run_threads(job, tmp / "run")
    return job, prove_run(tmp / "run", job, KEYS[0], tmp / "bundle")
