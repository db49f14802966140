"""``dk calibrate``: measure honest reproduction error and recommend a tolerance (SPEC §12.3).

Trains the first few intervals of a job with one thread count, replays each interval from its
start checkpoint under other thread counts, and reports the normalised distances
(:func:`dk.pol.replay.distances`). The recommended tolerance is ``safety ×`` the largest honest
``l2`` distance seen, floored at ``floor`` so that a bit-exact platform still gets a usable
threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dk.pol.data import check_dims, load_dataset
from dk.pol.job import JobSpec
from dk.pol.models import build_model
from dk.pol.sampler import job_sampler


@dataclass
class Calibration:
    """Measured distances and the recommendation."""

    intervals: int
    train_threads: int
    replay_threads: list[int]
    rows: list[dict[str, Any]] = field(default_factory=list)
    max_l2: float = 0.0
    recommended_tolerance: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def calibrate(
    job: JobSpec,
    *,
    intervals: int = 3,
    train_threads: int = 1,
    replay_threads: tuple[int, ...] = (1, 2),
    safety: float = 10.0,
    floor: float = 1e-6,
) -> Calibration:
    """Measure replay distances of the first ``intervals`` intervals of ``job``."""
    import torch

    from dk.pol.replay import distances, replay_interval
    from dk.pol.torch_adapter import (
        batch_tensors,
        deterministic,
        make_loss,
        make_optimizer,
        snapshot,
        train_step,
    )

    ds = load_dataset(job)
    check_dims(job, ds)
    sampler = job_sampler(job, len(ds))
    steps = job.checkpoint_steps()[: intervals + 1]
    model = build_model(job)
    opt = make_optimizer(job, model.parameters())
    loss_fn = make_loss(job, ds.output_dim)
    cks = []
    old = torch.get_num_threads()
    with deterministic(None):
        torch.set_num_threads(train_threads)
        cks.append(snapshot(model, opt, job, 0, sampler.steps_per_epoch))
        for a, b in zip(steps[:-1], steps[1:], strict=True):
            for t in range(a, b):
                train_step(model, opt, loss_fn, *batch_tensors(ds, sampler.batch(t)))
            cks.append(snapshot(model, opt, job, b, sampler.steps_per_epoch))
        torch.set_num_threads(old)
    cal = Calibration(
        intervals=len(steps) - 1, train_threads=train_threads, replay_threads=list(replay_threads)
    )
    for i in range(len(steps) - 1):
        for th in replay_threads:
            end = _replay_threads(job, ds, cks[i], steps[i], steps[i + 1], th, replay_interval)
            d = distances(cks[i], cks[i + 1], end)
            cal.rows.append({"interval": i, "threads": th, **d})
            cal.max_l2 = max(cal.max_l2, d["l2"])
    cal.recommended_tolerance = max(floor, safety * cal.max_l2)
    return cal


def _replay_threads(
    job: JobSpec, ds: Any, start: Any, a: int, b: int, threads: int, replay: Any
) -> Any:
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return replay(job, ds, start, a, b, threads=None)
    finally:
        torch.set_num_threads(old)
