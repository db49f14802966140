"""Record and replay a job's intervals through the rounded backend (SPEC VI).

The library seam for ``pol.backend = "rounded"``: :func:`run_interval` trains steps
``start_step .. end_step - 1`` of a job from a checkpoint under :class:`RoundedMode` — recording
the interval's log (worker) or following a committed one (verifier) — with the job's model,
optimizer, loss and batches, exactly as :class:`dk.pol.replay.Replayer` does on plain torch.
:func:`record_run` trains a whole job this way: one checkpoint and one log blob per interval.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from dk.pol.backends.log import RoundingLog, check_binding
from dk.pol.backends.rounded import DEFAULT_TAU_LOG2, RoundedMode
from dk.pol.checkpoint import Tensors, initial_checkpoint

if TYPE_CHECKING:
    from dk.pol.job import JobSpec


def run_interval(
    job: JobSpec,
    dataset: Any,
    start: Mapping[str, np.ndarray],
    start_step: int,
    end_step: int,
    *,
    interval: int,
    log: RoundingLog | None = None,
) -> tuple[Tensors, RoundingLog]:
    """Train (``log=None``: record) or replay (follow ``log``) one interval.

    Args:
        job: the job (model, optimizer, loss, sampler and ``job_id``).
        dataset: the job's data.
        start: the interval's start checkpoint.
        start_step: its step.
        end_step: the step after the interval's last.
        interval: the interval index the log is bound to (SPEC VI §4).
        log: the committed log to follow, or None to record one.

    Returns:
        ``(end checkpoint, log)``.

    Raises:
        FormatError: with a SPEC VI §5 reason when ``log`` is bound elsewhere or does not fit
            the computation; ``UnsupportedOp`` when the model uses an uncovered operation.
    """
    from dk.pol.models import build_torch_model
    from dk.pol.sampler import job_sampler
    from dk.pol.torch_adapter import (
        batch_tensors,
        make_loss,
        make_optimizer,
        restore,
        snapshot,
        train_step,
    )

    model = build_torch_model(job.model)
    optimizer = make_optimizer(job, model.parameters())
    loss_fn = make_loss(job, dataset.output_dim)
    sampler = job_sampler(job, len(dataset))
    restore(start, model, optimizer, job)
    if log is None:
        mode = RoundedMode.record(job_id=job.job_id, interval=interval, tau_log2=DEFAULT_TAU_LOG2)
    else:
        check_binding(log, job_id=job.job_id, interval=interval, tau_log2=DEFAULT_TAU_LOG2)
        mode = RoundedMode.replay(log)
    with mode:
        for t in range(start_step, end_step):
            x, y = batch_tensors(dataset, sampler.batch(t))
            train_step(model, optimizer, loss_fn, x, y)
    out = mode.finish()
    return snapshot(model, optimizer, job, end_step, sampler.steps_per_epoch), out


def record_run(job: JobSpec, dataset: Any) -> tuple[list[Tensors], list[bytes]]:
    """Train a whole job: its checkpoints (step 0 first) and one log blob per interval."""
    from dk.pol.sampler import job_sampler

    steps = job.checkpoint_steps()
    ck = initial_checkpoint(job, job_sampler(job, len(dataset)).steps_per_epoch)
    checkpoints, blobs = [ck], []
    for i in range(len(steps) - 1):
        ck, log = run_interval(job, dataset, ck, steps[i], steps[i + 1], interval=i)
        checkpoints.append(ck)
        blobs.append(log.encode())
    return checkpoints, blobs
