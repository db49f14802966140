"""The order's economics: how many samples make skipping work a losing bet (SPEC V §10).

A worker paid ``price`` with ``stake`` at risk, who skips ``d`` of the ``m`` intervals of a job,
saves at most ``(d/m)·price`` of compute (a rational worker bids at least its cost, so its cost
of the whole job is at most the price). With ``s`` uniform samples without replacement the
verifier finds at least one skipped interval with probability

    p(d, s) = 1 − C(m−d, s) / C(m, s)

and then the worker loses its stake and is not paid: an expected loss of
``p(d, s)·(stake + price)``. With any positive stake one sample already makes every skip a
losing bet on average (``p(d, 1) = d/m``), and no number of samples makes a *whole* skip cost
more than ``stake + price``. The market therefore asks, with a margin ``gamma`` (default 10),
for every ``d`` in ``1..m``:

    p(d, s)·(stake + price) ≥ min( gamma·(d/m)·price , (1 − 1/gamma)·(stake + price) )

that is: the expected loss is at least ``gamma`` times the compute saved, and where the stake
is too small for that (large skips), the skip is caught with probability at least
``1 − 1/gamma``. :func:`economic_samples` returns the smallest such ``s`` (``m`` if none
smaller does). ``p(d, s)`` is computed as ``1 − Π_{i<s} (m−d−i)/(m−i)`` in binary64, in that
order, so every implementation gets the same ``s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dk.verifier.challenge import miss_probability as miss_probability  # SPEC I §12.1

DEFAULT_GAMMA = 10


def skipping_loses(m: int, s: int, price: int, stake: int, gamma: float) -> bool:
    """True iff ``s`` samples meet the rule of SPEC V §10 for every ``d`` in ``1..m``."""
    at_risk = stake + price
    for d in range(1, m + 1):
        p = 1.0 - miss_probability(m, d, s)
        if p * at_risk < min(gamma * (d / m) * price, (1.0 - 1.0 / gamma) * at_risk):
            return False
    return True


def _skipping_loses_fast(m: int, s: int, price: int, stake: int, gamma: float) -> bool:
    """:func:`skipping_loses`, every ``d`` at once in NumPy: the same binary64 operations in the
    same order on each ``d`` (integers below 2^53 are exact in binary64, and ``a / b`` of two
    of them is the correctly rounded quotient, as Python's ``int / int``), so the same answer
    in ``O(s)`` vector passes instead of ``O(m·s)`` Python steps."""
    if m >= 1 << 53 or stake + price >= 1 << 53:
        return skipping_loses(m, s, price, stake, gamma)
    at_risk = float(stake + price)
    d = np.arange(1, m + 1, dtype=np.float64)
    miss = np.ones(m)
    for i in range(min(s, m - 1)):  # d = m has no factors to take: it is masked below
        miss *= (m - d - i) / float(m - i)
    miss[s > m - d] = 0.0  # miss_probability: no way to miss (and the factors above crossed 0)
    p = 1.0 - miss
    bound = np.minimum(gamma * (d / m) * float(price), (1.0 - 1.0 / gamma) * at_risk)
    return not bool((p * at_risk < bound).any())


def economic_samples(m: int, price: int, stake: int, gamma: float = DEFAULT_GAMMA) -> int:
    """Smallest ``s`` for which skipping any fraction of the work loses money (SPEC V §10).

    Args:
        m: intervals of the job.
        price: what the worker is paid (smallest units).
        stake: what the worker loses when caught.
        gamma: required ratio of expected loss to expected gain (≥ 1).

    Raises:
        ValueError: on a non-positive ``m`` or ``price``, a negative stake or ``gamma < 1``.
    """
    if m < 1 or price < 1 or stake < 0 or gamma < 1:
        raise ValueError("need m >= 1, price >= 1, stake >= 0 and gamma >= 1")
    # skipping_loses is monotone in s: the least s by doubling from 1, then halving the last
    # gap (the answer is small, and a check costs O(s) passes over every d: a binary search
    # from m checked s near m/2 first, minutes at m = 100 000)
    lo, hi = 1, 1  # lo: the least s not yet ruled out; hi: the next to check
    while not _skipping_loses_fast(m, hi, price, stake, gamma):
        if hi == m:
            return m
        lo, hi = hi + 1, min(m, 2 * hi)
    while lo < hi:
        mid = (lo + hi) // 2
        if _skipping_loses_fast(m, mid, price, stake, gamma):
            hi = mid
        else:
            lo = mid + 1
    return lo


def order_samples(m: int, price: int, stake: int, floor: int) -> int:
    """The economic default of an order that gives no ``samples`` (SPEC V §10).

    ``min(m, max(floor, economic_samples(m, price, stake)))``: ``m`` intervals of the committed
    manifest, the matched ``price``, the worker's locked ``stake`` for the order, and the
    market's configured ``samples`` as a floor.
    """
    return min(m, max(floor, economic_samples(m, max(price, 1), max(stake, 0))))


def manifest_intervals(manifest: dict[str, Any]) -> int:
    """``m``: the intervals of a manifest (its checkpoints after checkpoint 0), at least 1."""
    return max(1, len(manifest["checkpoints"]) - 1)


@dataclass(frozen=True)
class PolicyExplanation:
    """What ``dk market explain`` shows for one order's challenge policy."""

    m: int
    price: int
    stake: int
    gamma: float
    samples: int
    rows: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "m": self.m,
            "price": self.price,
            "stake": self.stake,
            "gamma": self.gamma,
            "samples": self.samples,
            "rows": self.rows,
        }


def explain(
    m: int, price: int, stake: int, *, samples: int | None = None, gamma: float = DEFAULT_GAMMA
) -> PolicyExplanation:
    """For skipped fractions 1 %, 5 %, 10 %, 25 %, 50 % and 100 %: detection probability,
    the compute a cheater saves and its expected loss at ``samples`` (default:
    :func:`economic_samples`)."""
    s = economic_samples(m, price, stake, gamma) if samples is None else samples
    rows = []
    for frac in (0.01, 0.05, 0.10, 0.25, 0.50, 1.0):
        d = max(1, min(m, round(frac * m)))
        p = 1.0 - miss_probability(m, d, s)
        rows.append(
            {
                "skipped": d,
                "fraction": d / m,
                "detect": p,
                "expected_gain": (d / m) * price,
                "expected_loss": p * (stake + price),
            }
        )
    return PolicyExplanation(m, price, stake, gamma, s, rows)
