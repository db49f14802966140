"""Data-parallel test fixtures: a two-rank job, rank keys, and an in-process group."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import tiny_job

from dk.crypto.keys import SigningKey

KEYS = [SigningKey(bytes([r + 1]) * 32) for r in range(4)]


def dp_job(world_size: int = 2, **kw: Any) -> Any:
    """The tiny digits job (20 steps, intervals of 5, batch 16) on ``world_size`` ranks."""
    return tiny_job(**kw).with_updates(train={"world_size": world_size})


class ThreadGroup:
    """``W`` ranks as threads of this process, with a real rank-ordered all-gather."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._slots: list[bytes] = [b""] * world_size
        self._barrier = threading.Barrier(world_size, timeout=60)

    def comm(self, rank: int) -> Any:
        group = self

        class _Comm:
            def __init__(self) -> None:
                self.rank, self.world_size = rank, group.world_size

            def all_gather_bytes(self, data: bytes) -> list[bytes]:
                group._slots[rank] = data
                group._barrier.wait()
                out = list(group._slots)
                group._barrier.wait()
                return out

        return _Comm()


def run_threads(
    job: Any, run_dir: Path, *, fault: Callable[..., Any] | None = None, fault_rank: int = 1
) -> None:
    """Train ``job`` on ``W`` thread ranks (rank 0 writes ``run_dir``); re-raise any error."""
    from dk.dist.rank import train_rank

    group = ThreadGroup(job.world_size)
    errors: list[BaseException] = []

    def body(r: int) -> None:
        try:
            train_rank(
                job,
                run_dir if r == 0 else None,
                comm=group.comm(r),
                key=KEYS[r],
                fault=fault if r == fault_rank else None,
            )
        except BaseException as e:  # surfaced below
            errors.append(e)
            group._barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(job.world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]


@pytest.fixture(scope="module")
def honest_dp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """A proved honest two-rank bundle (thread ranks)."""
    from dk.prover import prove_run

    tmp = tmp_path_factory.mktemp("dp-honest")
    job = dp_job()
    run_threads(job, tmp / "run")
    return job, prove_run(tmp / "run", job, KEYS[0], tmp / "bundle")
