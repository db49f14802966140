"""Learning-rate schedules computed by dk from the step index (SPEC §8.4).

``lr_at(job, t)`` is the learning rate of step ``t`` (0-based), in binary64:

* warm-up (``warmup_steps = W > 0``, ``t < W``): ``lr · (t + 1) / W``;
* ``constant``: ``lr``;
* ``step``: ``lr · gamma^(t // step_size)``, the power taken by repeated multiplication;
* ``cosine``: with ``p = (t − W) / max(1, steps − W)``,
  ``min_lr + (lr − min_lr) · 0.5 · (1 + cos(π · p))``.

The schedule's state is the step itself (``meta/step``); the learning rate is never read from
a bundle. :class:`JobScheduler` is the same schedule as a ``torch.optim.lr_scheduler``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dk.pol.job import JobSpec


def lr_at(job: JobSpec, t: int) -> float:
    """The job's learning rate at step ``t``."""
    tr = job.train
    lr, warm = float(tr["lr"]), int(tr["warmup_steps"])
    if warm > 0 and t < warm:
        return lr * (t + 1) / warm
    kind = tr["schedule"]
    if kind == "step":
        out = lr
        for _ in range(t // int(tr["step_size"])):
            out *= float(tr["gamma"])
        return out
    if kind == "cosine":
        lo = float(tr["min_lr"])
        p = (t - warm) / max(1, job.steps - warm)
        return lo + (lr - lo) * 0.5 * (1.0 + math.cos(math.pi * p))
    return lr


def make_scheduler(job: JobSpec, optimizer: Any) -> Any:
    """The job's schedule as a torch LR scheduler over ``optimizer``."""
    return JobScheduler(job, optimizer)


def _scheduler_base() -> Any:
    from torch.optim.lr_scheduler import LRScheduler

    return LRScheduler


class JobScheduler(_scheduler_base()):  # type: ignore[misc]
    """``torch.optim.lr_scheduler`` that sets every group's lr to :func:`lr_at`."""

    def __init__(self, job: JobSpec, optimizer: Any, last_epoch: int = -1) -> None:
        self.job = job
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """LR of step ``last_epoch`` for each group."""
        return [lr_at(self.job, max(0, self.last_epoch)) for _ in self.optimizer.param_groups]
