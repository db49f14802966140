"""The per-interval training loss committed in the transcript (SPEC §11.7).

Each interval's ``ext`` object (SPEC §11.5) carries ``"loss"``: the mean over the interval's
steps of the step's training loss, in binary64::

    ℓ_t = ((l_{t,0} ⊕ l_{t,1}) ⊕ …) ⊕ l_{t,A−1}       micro-batch j = 0 … A−1 in order
    ℓ   = fold_sum(ℓ_a, …, ℓ_{b−1}) ⊘ (b − a)           SPEC §1.4, steps in order

where ``l_{t,j}`` is the float32 value of the job's loss on micro-batch ``j`` of step ``t``,
divided by the number ``A`` of micro-batches (what is back-propagated, SPEC §12.4), widened to
binary64; on dk's kernels (``A = 1``) it is the kernel's batch loss (SPEC Part II §3).

The worker's Recorder and ``dk train`` compute it from the forward pass the step really made;
the verifier recomputes it on replay of each challenged interval and compares: bit for bit in
exact mode, within :func:`loss_rtol` in tolerant mode (``LOSS_MISMATCH``). Exact and tolerant
jobs on the ``dk`` and ``torch`` backends must carry it on every interval (``LOSS_MISSING``);
zk-mode intervals carry none (the proofs bind no loss).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dk.crypto.numeric import fold_sum_inplace

if TYPE_CHECKING:
    from dk.pol.job import JobSpec

__all__ = [
    "LOSS_KEY",
    "LossMeter",
    "check_loss_value",
    "interval_loss",
    "loss_close",
    "loss_required",
    "loss_rtol",
    "step_loss",
]

#: The interval extension key (SPEC §11.5 table).
LOSS_KEY = "loss"
#: Floors of the tolerant-mode relative bound on a loss (SPEC §11.7), per job precision.
LOSS_RTOL_FLOOR = {"fp32": 1e-4, "bf16": 1e-2, "fp16": 1e-2}
#: Intervals of up to this many steps are folded in Python floats (no array for a few).
_PY_FOLD_MAX = 64
#: Below this the comparison is absolute (a loss that reached zero).
LOSS_ABS_FLOOR = 1e-6


def check_loss_value(value: Any, where: str) -> None:
    """Validator of ``ext.loss`` (SPEC §11.7): a finite, non-negative binary64 number.

    Raises:
        ValueError: with a one-line message naming ``where``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where} must be a number")
    if isinstance(value, int) and float(value) != value:  # SPEC §1.3: integer token, binary64
        raise ValueError(f"{where} {value} is not a binary64 value")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where} must be finite and non-negative")


def step_loss(micro: Sequence[float]) -> float:
    """``ℓ_t``: the micro-batch losses (already divided by their count) added in order."""
    total = 0.0
    for v in micro:
        total += float(v)
    return total


def interval_loss(steps: Sequence[float]) -> float:
    """``ℓ``: the fold sum (SPEC §1.4) of the step losses in step order, over their count."""
    if not steps:
        raise ValueError("an interval has at least one step")
    v = [float(s) for s in steps]
    if len(v) > _PY_FOLD_MAX:
        return fold_sum_inplace(np.array(v, dtype=np.float64)) / len(v)
    n = len(v)  # the same fold in Python floats (binary64, one IEEE addition each)
    while n > 1:
        h = n // 2
        for i in range(h):
            v[i] += v[n - h + i]
        n -= h
    return v[0] / len(steps)


def loss_required(job: JobSpec) -> bool:
    """True when every interval of the job's bundles must carry ``ext.loss`` (SPEC §11.7).

    Data-parallel runs (``train.world_size > 1``) do not record it yet (each rank sees only its
    shard's loss); there it is optional, like on the ``rounded`` backend."""
    return (
        job.mode in ("exact", "tolerant")
        and job.pol.get("backend", "dk") in ("dk", "torch")
        and job.world_size == 1
    )


def loss_rtol(job: JobSpec) -> float:
    """Tolerant mode: the relative bound on a claimed loss, ``max(tolerance, floor)``."""
    floor = LOSS_RTOL_FLOOR.get(str(job.train.get("precision", "fp32")), 1e-2)
    return max(float(job.pol.get("tolerance", 0.0)), floor)


def loss_close(job: JobSpec, claimed: float, replayed: float) -> bool:
    """SPEC §11.7: exact mode bit-equal; tolerant ``|c − r| ≤ rtol · max(|r|, 10⁻⁶)``."""
    if not math.isfinite(replayed):
        return False
    if job.mode != "tolerant":
        return claimed == replayed
    return abs(claimed - replayed) <= loss_rtol(job) * max(abs(replayed), LOSS_ABS_FLOOR)


class LossMeter:
    """Collects the losses of the current step and interval, as training goes.

    ``add`` takes each micro-batch's loss *before* the division by ``accumulation``: a 0-d
    torch tensor stays on its device (no host sync per micro-batch), a number is taken as is.
    At :meth:`take`, once per interval, the tensors are stacked, divided by ``accumulation``
    in their own dtype (the float32 division the step back-propagates, SPEC §11.7: elementwise
    IEEE division, the same bits as dividing each 0-d loss) and read in one transfer.
    """

    def __init__(self, accumulation: int = 1) -> None:
        if accumulation < 1:
            raise ValueError(f"accumulation must be positive, got {accumulation}")
        self._acc = accumulation
        self._micro: list[Any] = []
        self._steps: list[list[Any]] = []

    def add(self, value: Any) -> None:
        """One micro-batch's loss (not yet divided by the number of micro-batches)."""
        self._micro.append(value)

    def end_step(self) -> None:
        """Close the current step."""
        self._steps.append(self._micro)
        self._micro = []

    def pending(self) -> int:
        """Steps closed since the last :meth:`take`."""
        return len(self._steps)

    def take(self) -> float:
        """The interval's loss ``ℓ`` over the closed steps; starts the next interval."""
        steps, self._steps = self._steps, []
        if any(not s for s in steps):
            raise ValueError("a step recorded no loss")
        flat = _divided([v for s in steps for v in s], self._acc)
        out, pos = [], 0
        for s in steps:
            out.append(step_loss(flat[pos : pos + len(s)]))
            pos += len(s)
        return interval_loss(out)


def _divided(values: list[Any], acc: int) -> list[float]:
    """``f64(v ⊘ acc)`` for each value: tensors divided on their device in their dtype, read
    with one transfer; numbers divided in float32 (``acc = 1``: taken as they are)."""
    if values and all(hasattr(v, "detach") for v in values):
        import torch

        t = torch.stack([v.detach().reshape(()) for v in values])
        if acc != 1:
            t = t / acc
        return [float(x) for x in t.cpu().tolist()]
    if acc == 1:
        return [_to_float(v) for v in values]
    return [float(np.float32(_to_float(v)) / np.float32(acc)) for v in values]


def _to_float(v: Any) -> float:
    if hasattr(v, "detach"):
        return float(v.detach().cpu().item())
    return float(v)
