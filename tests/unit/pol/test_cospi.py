"""The cosine schedule's ``cospi64`` (SPEC Part II §4, Part I §8.4): the same bits as a program
re-implemented from the SPEC text, and close to ``cos(π·p)``."""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from tests.helpers import tiny_job

from dk.pol.schedule import cospi64, lr_at

SPEC = (Path(__file__).resolve().parents[3] / "SPEC.md").read_text(encoding="utf-8")
HEX = r"-?0x1(?:\.[0-9a-f]+)?p[+-]\d+"


def _constants() -> tuple[float, list[float], list[float]]:
    text = SPEC[SPEC.index("**cospi64(p)**") :]
    text = text[: text.index("cospi64(p) = s · r")]
    pi = float.fromhex(re.search(rf"PI64 = ({HEX})", text).group(1))  # type: ignore[union-attr]
    k = text[text.index("K0 … K8") : text.index("J0 … J8")]
    j = text[text.index("J0 … J8") : text.index("s = 1")]
    ks = [float.fromhex(h) for h in re.findall(rf"`({HEX})`", k)]
    js = [float.fromhex(h) for h in re.findall(rf"`({HEX})`", j)]
    return pi, ks, js


def _spec_cospi(p: float) -> float:
    """The program as SPEC Part II §4 writes it."""
    pi, ks, js = _constants()
    s, q = 1.0, p
    if q > 0.5:
        q, s = 1.0 - q, -1.0
    if q > 0.25:
        x = pi * (0.5 - q)
        z = x * x
        c = js[8]
        for a in js[7::-1]:
            c = c * z + a
        r = x * c
    else:
        x = pi * q
        z = x * x
        c = ks[8]
        for a in ks[7::-1]:
            c = c * z + a
        r = c
    return s * r


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def test_constants_are_the_rationals() -> None:
    from fractions import Fraction

    pi, ks, js = _constants()
    assert len(ks) == len(js) == 9 and pi == math.pi
    for n, c in enumerate(ks):
        assert c == float(Fraction((-1) ** n, math.factorial(2 * n)))
    for n, c in enumerate(js):
        assert c == float(Fraction((-1) ** n, math.factorial(2 * n + 1)))


def test_same_bits_as_the_spec_text_and_accurate() -> None:
    rng = np.random.default_rng(11)
    ps = [0.0, 0.25, 0.5, 0.75, 1.0, 1e-300, 0.25 + 2**-54, 0.5 - 2**-53, 0.5 + 2**-53]
    ps += [float(p) for p in rng.random(3000)]
    ps += [t / 997 for t in range(998)]
    worst = 0.0
    for p in ps:
        got = cospi64(p)
        assert _bits(got) == _bits(_spec_cospi(p)), p
        worst = max(worst, abs(got - math.cos(math.pi * p)))
    assert worst <= 1e-15
    assert cospi64(0.0) == 1.0 and cospi64(1.0) == -1.0 and cospi64(0.5) == 0.0


@pytest.mark.parametrize("p", [-1e-9, 1.0000000000000002, float("nan")])
def test_outside_the_domain(p: float) -> None:
    with pytest.raises(ValueError):
        cospi64(p)


def test_cosine_schedule_uses_it() -> None:
    job = tiny_job(
        steps=50, train={"schedule": "cosine", "warmup_steps": 5, "lr": 0.1, "min_lr": 0.001}
    )
    for t in range(50):
        want = (
            0.1 * (t + 1) / 5
            if t < 5
            else 0.001 + (0.1 - 0.001) * 0.5 * (1.0 + _spec_cospi((t - 5) / 45))
        )
        assert _bits(lr_at(job, t)) == _bits(want), t
