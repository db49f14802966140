"""Learning-rate schedules computed by dk from the step index (SPEC §8.4).

``lr_at(job, t)`` is the learning rate of step ``t`` (0-based), in binary64:

* warm-up (``warmup_steps = W > 0``, ``t < W``): ``lr · (t + 1) / W``;
* ``constant``: ``lr``;
* ``step``: ``lr · gamma^(t // step_size)``, the power taken by repeated multiplication;
* ``cosine``: with ``p = (t − W) / max(1, steps − W)``,
  ``min_lr + (lr − min_lr) · 0.5 · (1 + cospi64(p))``, where :func:`cospi64` is the fixed
  binary64 program of SPEC Part II §4 (never libm's ``cos``, whose last bit differs between
  platforms), so the learning rate of every step is the same bits on every machine.

The schedule's state is the step itself (``meta/step``); the learning rate is never read from
a bundle. :class:`JobScheduler` is the same schedule as a ``torch.optim.lr_scheduler``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dk.pol.job import JobSpec


#: ``f64(π)`` and the Taylor coefficients ``f64((−1)^k / (2k)!)``, ``f64((−1)^k / (2k+1)!)``,
#: k = 0 … 8 (SPEC Part II §4, ``cospi64``), exactly as written there in C99 hex.
PI64 = float.fromhex("0x1.921fb54442d18p+1")
COS64 = tuple(
    float.fromhex(h)
    for h in (
        "0x1p+0",
        "-0x1p-1",
        "0x1.5555555555555p-5",
        "-0x1.6c16c16c16c17p-10",
        "0x1.a01a01a01a01ap-16",
        "-0x1.27e4fb7789f5cp-22",
        "0x1.1eed8eff8d898p-29",
        "-0x1.93974a8c07c9dp-37",
        "0x1.ae7f3e733b81fp-45",
    )
)
SIN64 = tuple(
    float.fromhex(h)
    for h in (
        "0x1p+0",
        "-0x1.5555555555555p-3",
        "0x1.1111111111111p-7",
        "-0x1.a01a01a01a01ap-13",
        "0x1.71de3a556c734p-19",
        "-0x1.ae64567f544e4p-26",
        "0x1.6124613a86d09p-33",
        "-0x1.ae7f3e733b81fp-41",
        "0x1.952c77030ad4ap-49",
    )
)


def _horner(coef: tuple[float, ...], z: float) -> float:
    c = coef[-1]
    for a in reversed(coef[:-1]):
        c = c * z + a  # two binary64 operations, no FMA (Python floats never fuse)
    return c


def cospi64(p: float) -> float:
    """``cos(π·p)`` for ``0 ≤ p ≤ 1`` by the binary64 program of SPEC Part II §4.

    Raises:
        ValueError: for ``p`` outside ``[0, 1]`` (or NaN).
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"cospi64 needs 0 <= p <= 1, not {p!r}")
    sign, q = 1.0, p
    if q > 0.5:
        q, sign = 1.0 - q, -1.0  # exact (Sterbenz)
    if q > 0.25:
        x = PI64 * (0.5 - q)  # 0.5 - q exact; cos(πq) = sin(π(1/2 - q))
        return sign * (x * _horner(SIN64, x * x))
    x = PI64 * q
    return sign * _horner(COS64, x * x)


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
        return lo + (lr - lo) * 0.5 * (1.0 + cospi64(min(p, 1.0)))
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
