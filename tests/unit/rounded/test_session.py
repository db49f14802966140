"""``pol.backend = "rounded"`` jobs: record a run, replay a challenged interval from its log."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dk.errors import BackendUnavailable, FormatError
from dk.pol.backends.log import LOG_MISMATCH, decode_log
from dk.pol.backends.session import record_run, run_interval
from dk.pol.checkpoint import checkpoint_root
from dk.pol.data import load_dataset


@pytest.fixture(scope="module")
def job() -> Any:
    from dk.pol import default_job

    return default_job(
        arch="cnn", optimizer="adam", steps=6, interval=3, batch_size=16,
        pol={"backend": "rounded"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def run(job: Any) -> tuple[list[Any], list[bytes]]:
    torch.set_num_threads(1)
    return record_run(job, load_dataset(job))


def test_challenged_interval_replays_to_committed_root(job: Any, run: Any) -> None:
    checkpoints, blobs = run
    assert len(checkpoints) == 3 and len(blobs) == 2
    end, _ = run_interval(
        job, load_dataset(job), checkpoints[1], 3, 6, interval=1, log=decode_log(blobs[1])
    )
    assert checkpoint_root(end) == checkpoint_root(checkpoints[2])


def test_log_of_another_interval_rejected(job: Any, run: Any) -> None:
    checkpoints, blobs = run
    with pytest.raises(FormatError) as e:
        run_interval(
            job, load_dataset(job), checkpoints[1], 3, 6, interval=1, log=decode_log(blobs[0])
        )
    assert e.value.reason == LOG_MISMATCH


def test_job_accepts_rounded_only_for_exact_mode() -> None:
    from dk.pol import default_job

    with pytest.raises(FormatError, match="rounded"):
        default_job(mode="tolerant", steps=4, interval=2, pol={"backend": "rounded"})


def test_recorder_and_plain_replayer_refuse_rounded_jobs(job: Any, tmp_path: Any) -> None:
    from dk.pol.recorder import JobMismatch, Recorder
    from dk.pol.replay import Replayer

    with pytest.raises(JobMismatch, match="rounded"):
        Recorder(job, tmp_path / "run")
    with pytest.raises(BackendUnavailable, match="rounded"):
        Replayer(job, load_dataset(job))
