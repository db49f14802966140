"""``dk calibrate``: honest reproduction error, the cheapest cheats, a tolerance (SPEC §12.3).

Trains the first few intervals of a job on one thread count and device, replays each interval
from its start checkpoint under the other thread counts and devices it is given, and reports
the normalised distances (:func:`dk.pol.replay.distances`). The recommended tolerance is
``safety ×`` the largest honest ``l2`` distance, floored at ``floor``. This is the one source of
the tolerance: ``dk job init`` writes what :func:`calibrate` recommends for the same job.

Next to it, the distance the cheapest cheats reach on the same intervals (each claimed end
replayed honestly from the same start, as a verifier would):

* ``half_steps_double_lr``: half the interval's steps at twice the learning rate;
* ``lower_precision``: autocast bf16 where the job says fp32;
* ``half_batch``: half the batch size (half the work per step).

A tolerance that any cheat lands inside is refused (:class:`UnsafeTolerance`) unless ``force``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dk.errors import DkError
from dk.pol.data import check_dims, load_dataset
from dk.pol.job import JobSpec

SAFETY = 10.0
TOLERANCE_FLOOR = 1e-6


class UnsafeTolerance(DkError):
    """A cheat lands inside the tolerance calibration would recommend."""

    def __init__(self, message: str, calibration: Calibration) -> None:
        super().__init__(message)
        self.calibration = calibration


@dataclass
class Calibration:
    """Measured distances, the cheats' distances and the recommendation."""

    intervals: int
    train_threads: int
    replay_threads: list[int]
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    rows: list[dict[str, Any]] = field(default_factory=list)
    max_l2: float = 0.0
    recommended_tolerance: float = 0.0
    cheats: dict[str, float] = field(default_factory=dict)
    safe: bool = True
    forced: bool = False
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def recommend(max_l2: float, *, safety: float = SAFETY, floor: float = TOLERANCE_FLOOR) -> float:
    """The tolerance recommended for a largest honest distance ``max_l2``."""
    return max(floor, safety * max_l2)


def _cheat_jobs(job: JobSpec) -> dict[str, tuple[JobSpec, float]]:
    """Each cheat as (job it trains, fraction of the interval's steps it runs)."""
    t = job.train
    out: dict[str, tuple[JobSpec, float]] = {
        "half_steps_double_lr": (job.with_updates(train={"lr": min(2 * t["lr"], 1e3)}), 0.5)
    }
    if t["precision"] == "fp32":
        out["lower_precision"] = (
            job.with_updates(train={"precision": "bf16"}, pol={"backend": "torch"}),
            1.0,
        )
    if t["batch_size"] >= 2:
        b = t["batch_size"] // 2
        acc = t["accumulation"] if b % t["accumulation"] == 0 else 1
        out["half_batch"] = (
            job.with_updates(train={"batch_size": b, "accumulation": acc}),
            1.0,
        )
    return out


def calibrate(
    job: JobSpec,
    *,
    intervals: int = 3,
    train_threads: int = 1,
    replay_threads: tuple[int, ...] = (1, 2),
    devices: tuple[str, ...] = ("cpu",),
    safety: float = SAFETY,
    floor: float = TOLERANCE_FLOOR,
    cheats: bool = True,
    force: bool = False,
) -> Calibration:
    """Measure honest and cheating replay distances of the first ``intervals`` intervals.

    Raises:
        UnsafeTolerance: a cheat's distance is within the recommended tolerance (not forced).
    """
    from dk.pol.checkpoint import initial_checkpoint
    from dk.pol.replay import Replayer, distances

    ds = load_dataset(job)
    check_dims(job, ds)
    honest_job = job.with_updates(pol={"mode": "tolerant", "tolerance": 1.0, "backend": "torch"})
    trainer = Replayer(honest_job, ds, threads=train_threads, device=devices[0])
    steps = job.checkpoint_steps()[: intervals + 1]
    cks = [initial_checkpoint(job, trainer.sampler.steps_per_epoch)]
    for a, b in zip(steps[:-1], steps[1:], strict=True):
        cks.append(trainer.run(cks[-1], a, b))
    cal = Calibration(
        intervals=len(steps) - 1,
        train_threads=train_threads,
        replay_threads=list(replay_threads),
        devices=list(devices),
    )
    replayers = [
        (dev, th, Replayer(honest_job, ds, threads=th, device=dev))
        for dev in devices
        for th in replay_threads
    ]
    for i in range(len(steps) - 1):
        for dev, th, rep in replayers:
            end = rep.run(cks[i], steps[i], steps[i + 1])
            d = distances(cks[i], cks[i + 1], end)
            cal.rows.append({"interval": i, "device": dev, "threads": th, **d})
            cal.max_l2 = max(cal.max_l2, d["l2"])
    cal.recommended_tolerance = recommend(cal.max_l2, safety=safety, floor=floor)
    if not cheats:
        return cal
    for name, (cjob, frac) in _cheat_jobs(honest_job).items():
        cheater = Replayer(cjob, ds, threads=train_threads, device=devices[0])
        best = float("inf")
        for i in range(len(steps) - 1):
            a, b = steps[i], steps[i + 1]
            claimed = cheater.run(cks[i], a, a + max(1, int((b - a) * frac)))
            honest = trainer.run(cks[i], a, b)
            best = min(best, distances(cks[i], claimed, honest)["l2"])
        cal.cheats[name] = best
    inside = sorted(n for n, d in cal.cheats.items() if d <= cal.recommended_tolerance)
    if inside:
        cal.safe = False
        cal.note = (
            f"tolerance {cal.recommended_tolerance:.3g} would accept {', '.join(inside)} "
            f"(distance {min(cal.cheats[n] for n in inside):.3g}); use exact mode, longer "
            "intervals or fewer thread/device differences"
        )
        if not force:
            raise UnsafeTolerance(f"refusing to recommend a tolerance: {cal.note}", cal)
        cal.forced = True
    return cal
