"""The bounded scan's two passes (``_scan.py``): a branch-free pass that keeps a superset, and
``scan_bounded``'s thresholds on what it kept, give ``scan_bounded``'s result on every element.

The elements that matter are those at their threshold: ``D`` equal to ``floor(t_e)`` (in) and
one more (out), with ``|x|`` just under a power of two, where the first pass's condition is
tightest (``|x|/g`` near ``2^24``). Specials (zeros, tiny, NaN, infinities, values past
float32's range, ``S`` NaN or infinite) must come out the same too, and ``S`` given as factors
(``Outer``) must give what the same bound as an array gives.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dk.pol.backends import _scan
from dk.pol.backends._scan import HALF, M29, Outer, bounded_scan, scan_bounded
from dk.pol.backends.bounds import C_MISSING, C_RECORD, T_CAP, bound_cap, thresholds

CONSTS = (C_RECORD, C_MISSING, T_CAP, T_CAP // 2)
T_BITS = 1 << 19
WIDE = (1 << 28) - 1  # the widest t: the cap near 2^28, where the margin is needed most


def _consts(t_bits: int) -> tuple[float, float, int, int]:
    cap = bound_cap(t_bits)
    return (C_RECORD, C_MISSING, cap, cap // 2)


def _reference(
    v: np.ndarray, s: np.ndarray, k: tuple[int, int], use_m: bool, consts: Any = CONSTS
) -> tuple[np.ndarray, np.ndarray]:
    """``scan_bounded`` on every element: one pass, the thresholds of SPEC's formula."""
    r, idx = np.empty(v.size, np.float32), np.empty(v.size, np.int64)
    n, _ = scan_bounded(v, np.asarray(s, np.float64), k[0], k[1], *consts, use_m, r, idx)
    return r, idx[:n]


def _at_threshold(
    rng: np.random.Generator, s: np.ndarray, k: tuple[int, int], use_m: bool, t_bits: int = T_BITS
) -> np.ndarray:
    """Values whose ``D`` is ``floor(threshold) + {-1, 0, 1}`` under ``S = s``, ``|x|`` just
    under ``2^(e+1)`` (every third element) or anywhere in its binade."""
    n = s.size
    e = rng.integers(-20, 20, n)
    top = np.where(np.arange(n) % 3 == 0, (1 << 23) - 1 - rng.integers(0, 4, n), 0)
    hi = np.where(top > 0, top, rng.integers(0, 1 << 23, n))
    sign = rng.choice(np.array([0, 1 << 63], dtype=np.uint64), n)
    base = ((e + 1023).astype(np.uint64) << np.uint64(52)) | (hi.astype(np.uint64) << np.uint64(29))
    v = (base | np.uint64(HALF)).view(np.float64)  # on the boundary: the binade and gap of v
    t_e, m_e = thresholds(v, s, k[0], t_bits, k[1])
    thr = m_e if use_m else t_e
    d = np.floor(thr).astype(np.int64) + rng.integers(-1, 2, n)
    d = np.clip(d, 0, HALF - 1)
    low = (HALF + d * rng.choice([-1, 1], n)) & M29
    return ((base | low.astype(np.uint64)) | sign).view(np.float64)


def _specials(rng: np.random.Generator, v: np.ndarray, s: np.ndarray) -> None:
    """Overwrite some elements with specials, in place."""
    n = v.size
    pick = rng.choice(n, size=n // 4, replace=False)
    vals = np.array(
        [0.0, -0.0, np.nan, np.inf, -np.inf, 1e39, -3.5e38, 2.0**-126, -(2.0**-140), 5e-324, 1.5]
    )
    v[pick] = rng.choice(vals, pick.size)
    s_pick = rng.choice(n, size=n // 10, replace=False)
    s[s_pick] = rng.choice(np.array([np.nan, np.inf, 0.0, 1e300]), s_pick.size)


@pytest.mark.parametrize("t_bits", [T_BITS, WIDE])
@pytest.mark.parametrize("use_m", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_two_passes_equal_one_pass_at_the_threshold(seed: int, use_m: bool, t_bits: int) -> None:
    """Seeds 2 and 3 add specials; ``S`` holds float32 values in seeds 1 and 3, and seed 1
    passes it as a float32 array (``Bound.s()`` on the CPU); ``WIDE`` puts the cap near
    ``2^28``."""
    rng = np.random.default_rng(seed)
    n = 30_000
    k = (int(rng.integers(1, 4096)), 0)
    k = (k[0], int(rng.integers(1, k[0] + 1)))
    s = np.exp2(rng.uniform(-30, 10, n)) * rng.uniform(1, 2, n)  # thresholds from 2 to the cap
    if seed % 2:
        s = s.astype(np.float32).astype(np.float64)
    v = _at_threshold(rng, s, k, use_m, t_bits)
    if seed >= 2:
        _specials(rng, v, s)
    consts = _consts(t_bits)
    given = s.astype(np.float32) if seed % 2 and seed < 2 else s
    r, idx, tiny = bounded_scan(v, given, k, consts, use_m)
    r_ref, idx_ref = _reference(v, s, k, use_m, consts)
    assert idx_ref.size > n // 10  # the threshold cases are in the test
    np.testing.assert_array_equal(idx, idx_ref)
    np.testing.assert_array_equal(r.view(np.int32), r_ref.view(np.int32))
    tiny_ref = bool(((v != 0) & (np.abs(v) < 2.0**-125)).any())
    assert tiny == tiny_ref


@pytest.mark.parametrize("use_m", [False, True])
@pytest.mark.parametrize(
    ("batch", "c_shape"), [(1, None), (1, (1, 1, 7)), (3, (3, 5, 7)), (3, (5, 1)), (2, ())]
)
def test_factors_equal_the_array_they_describe(
    batch: int, c_shape: tuple[int, ...] | None, use_m: bool
) -> None:
    rng = np.random.default_rng(batch * 10 + len(c_shape or (9,)))
    m, n = 5, 7
    rows = np.exp2(rng.uniform(-15, 5, (batch, m)))
    cols = np.exp2(rng.uniform(-15, 5, (batch, n)))
    c = None if c_shape is None else np.exp2(rng.uniform(-20, 0, c_shape))
    outer = Outer(rows, cols, c)
    flat = outer.full()
    np.testing.assert_array_equal(outer.at(np.arange(flat.size)), flat)
    if c is not None:
        expect = (rows[:, :, None] * cols[:, None, :] + c).reshape(-1)
        np.testing.assert_array_equal(flat, expect)
    k = (64, 64)
    for rep in range(4):
        v = _at_threshold(np.random.default_rng(rep), flat, k, use_m)
        r, idx, _ = bounded_scan(v, outer, k, CONSTS, use_m)
        r_ref, idx_ref = _reference(v, flat, k, use_m)
        np.testing.assert_array_equal(idx, idx_ref)
        np.testing.assert_array_equal(r.view(np.int32), r_ref.view(np.int32))


def test_the_first_pass_needs_its_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the margin (and the slack of ``|x|`` under ``2^(e+1)``) the first pass drops
    elements at their threshold: what the equality tests above guard."""
    rng = np.random.default_rng(7)
    s = np.exp2(rng.uniform(-30, 10, 20_000))
    v = _at_threshold(rng, s, (256, 256), False)
    ref = _reference(v, s, (256, 256), False)[1]
    monkeypatch.setattr(_scan, "_MARGIN", 1.0 - 2.0**-12)
    monkeypatch.setattr(_scan, "keep_bounded", _scan.keep_bounded.py_func)
    fewer = bounded_scan(v, s, (256, 256), CONSTS, False)[1]
    assert fewer.size < ref.size
