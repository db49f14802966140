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

CPU variants (:mod:`dk.pol.calibrate_cpu`): a worker on another CPU runs other torch kernels.
With ``cpu_variants`` (the default for tolerant jobs, which train on ``pol.backend = "torch"``)
each interval is also replayed, on the CPU, under every torch CPU capability below this
machine's (``ATEN_CPU_CAPABILITY=default`` always), in a subprocess each, and those distances
count towards the recommendation like the thread counts' and devices'.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from dk.errors import DkError
from dk.pol.data import check_dims, load_dataset
from dk.pol.job import JobSpec

SAFETY = 10.0
TOLERANCE_FLOOR = 1e-6
#: Intervals calibrated by default: ``dk calibrate``'s and ``dk job init``'s (one source).
DEFAULT_INTERVALS = 2


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
    #: torch's CPU capability here (``avx2``…), the capabilities replayed as CPU variants and
    #: those this CPU cannot run (so not measured: a worker there is not covered by measurement)
    cpu_capability: str = ""
    cpu_variants: list[str] = field(default_factory=list)
    cpu_not_measured: list[str] = field(default_factory=list)
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
    intervals: int = DEFAULT_INTERVALS,
    train_threads: int = 1,
    replay_threads: tuple[int, ...] = (1, 2),
    devices: tuple[str, ...] = ("cpu",),
    safety: float = SAFETY,
    floor: float = TOLERANCE_FLOOR,
    cheats: bool = True,
    force: bool = False,
    cpu_variants: bool | None = None,
    variant_timeout: float | None = None,
) -> Calibration:
    """Measure honest and cheating replay distances of the first ``intervals`` intervals.

    Args:
        cpu_variants: also replay on the CPU under the torch CPU capabilities below this
            machine's (a subprocess each); ``None``: for tolerant jobs (SPEC §12.3).
        variant_timeout: seconds each CPU variant may take; ``None``: 120 plus 20 × the time
            this process took to replay the same intervals.

    Raises:
        UnsafeTolerance: a cheat's distance is within the recommended tolerance (not forced).
        CpuVariantFailed: a CPU variant could not run here (one line; skip with
            ``cpu_variants=False``).
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
    if cpu_variants is None:
        cpu_variants = job.mode == "tolerant"
    if "cpu" in devices or cpu_variants:
        from dk.pol.calibrate_cpu import local_capability, variants

        cal.cpu_capability = local_capability()
        if cpu_variants:
            cal.cpu_variants, cal.cpu_not_measured = variants(cal.cpu_capability)
    t0 = time.monotonic()
    for i in range(len(steps) - 1):
        for dev, th, rep in replayers:
            end = rep.run(cks[i], steps[i], steps[i + 1])
            d = distances(cks[i], cks[i + 1], end)
            cpu = cal.cpu_capability if dev == "cpu" else ""
            cal.rows.append({"interval": i, "device": dev, "threads": th, "cpu": cpu, **d})
            cal.max_l2 = max(cal.max_l2, d["l2"])
    if cal.cpu_variants:
        from dk.pol.calibrate_cpu import replay_variant

        limit = variant_timeout
        if limit is None:  # the local replays' time per replayer, times 20, plus start-up
            limit = 120.0 + 20.0 * (time.monotonic() - t0) / max(1, len(replayers))
        for cap in cal.cpu_variants:
            ends = replay_variant(honest_job, cap, cks, steps, threads=train_threads, timeout=limit)
            for i, end in enumerate(ends):
                d = distances(cks[i], cks[i + 1], end)
                row = {"interval": i, "device": "cpu", "threads": train_threads, "cpu": cap}
                cal.rows.append({**row, **d})
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
        advice = (
            "use exact mode, longer intervals or fewer thread/device/CPU differences"
            if job.mode == "tolerant"
            else f"this job is {job.mode}: its replays must match bit for bit and no tolerance "
            "applies (a tolerance is for tolerant jobs)"
        )
        cal.note = (
            f"tolerance {cal.recommended_tolerance:.3g} would accept {', '.join(inside)} "
            f"(distance {min(cal.cheats[n] for n in inside):.3g}); {advice}"
        )
        if not force:
            raise UnsafeTolerance(f"refusing to recommend a tolerance: {cal.note}", cal)
        cal.forced = True
    return cal
