"""One-pass rounding scan of a float64 site (Numba): float32 rounding plus boundary candidates.

Equivalent to ``r = v.astype(float32) + float32(0)`` (a zero rounds to +0, SPEC VI §2) and
``flatnonzero(((bits(v) - lo) & (2^29 - 1)) <= width)`` (SPEC VI §2's bit test), fused into one
pass; LLVM's ``fptrunc`` rounds to nearest,
ties to even, as IEEE-754 and NumPy do. ``fastmath`` is off.
"""

from __future__ import annotations

import numba
import numpy as np

M29 = (1 << 29) - 1
TINY = 2.0**-125
HALF = 1 << 28
# the float32 gap of a normal float64 by its biased exponent field (SPEC VI §2)
GAPS = np.ldexp(1.0, np.arange(2048) - 1023 - 23)


@numba.njit(cache=True, nogil=True)
def scan_site(v, r, lo, width, idx):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    """Fill ``r``; write candidate indices into ``idx``; return (count, any tiny nonzero)."""
    bits = v.view(np.int64)
    n = 0
    tiny = False
    cap = idx.size
    for i in range(v.size):
        x = v[i]
        r[i] = np.float32(x) + np.float32(0.0)  # a zero is +0 (SPEC VI §2)
        if ((bits[i] - lo) & M29) <= width:
            if n < cap:
                idx[n] = i
            n += 1
        if x != 0.0 and abs(x) < TINY:
            tiny = True
    return n, tiny


def round_scan(v: np.ndarray, lo: int, width: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(float32 rounding, candidate indices, any tiny nonzero)`` of flat contiguous ``v``."""
    r = np.empty(v.size, dtype=np.float32)
    idx = np.empty(max(64, v.size >> 8), dtype=np.int64)
    n, tiny = scan_site(v, r, lo, width, idx)
    if n > idx.size:
        idx = np.empty(n, dtype=np.int64)
        n, tiny = scan_site(v, r, lo, width, idx)
    return r, idx[:n], bool(tiny)


@numba.njit(cache=True, nogil=True)
def scan_bounded(v, s, k, kg, c_rec, c_miss, t_cap, m_cap, use_m, r, idx):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Fill ``r``; write indices with ``D <= t_e`` (``use_m``: ``D <= m_e``) into ``idx``.

    The per-element thresholds are :func:`dk.pol.backends.bounds.thresholds`' formula, in the
    same order of float64 operations (no fastmath, so no contraction), ``kg`` the blocked
    sum's term count ``K'`` in ``γ``; tiny and non-finite values are left to the caller
    (returned flag).
    """
    bits = v.view(np.int64)
    n = 0
    tiny = False
    cap = idx.size
    gamma = kg * 2.0**-53 / (1.0 - kg * 2.0**-53)
    lo = HALF - (m_cap if use_m else t_cap)
    width = 2 * (m_cap if use_m else t_cap)
    for i in range(v.size):
        x = v[i]
        r[i] = np.float32(x) + np.float32(0.0)  # a zero is +0 (SPEC VI §2)
        a = abs(x)
        if x != 0.0 and a < TINY:
            tiny = True
            continue
        if ((bits[i] - lo) & M29) > width or not np.isfinite(np.float32(x)) or x == 0.0:
            continue
        d = abs((bits[i] & M29) - HALF)
        gap = GAPS[(bits[i] >> 52) & 0x7FF]  # 2^(e - 23) for |x| in [2^e, 2^(e+1))
        beta = gamma * (s[i] * (1.0 + k * 2.0**-23) + k * 2.0**-149) * 2.0**29 / gap
        if use_m:
            thr = min(c_miss * beta, float(m_cap)) if beta == beta else float(m_cap)
        else:
            thr = min(c_rec * beta + 2.0, float(t_cap)) if beta == beta else float(t_cap)
        if d <= thr:
            if n < cap:
                idx[n] = i
            n += 1
    return n, tiny


def bounded_scan(
    v: np.ndarray,
    s: np.ndarray,
    k: tuple[int, int],
    consts: tuple[float, float, int, int],
    use_m: bool,
) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(float32 rounding, indices within t_e (use_m: m_e), any tiny nonzero)`` of ``v``;
    ``k`` is ``(K, K')``: the site's term count and its blocked sum's (SPEC VI §2)."""
    r = np.empty(v.size, dtype=np.float32)
    idx = np.empty(max(64, v.size >> 6), dtype=np.int64)
    n, tiny = scan_bounded(v, s, k[0], k[1], *consts, use_m, r, idx)
    if n > idx.size:
        idx = np.empty(n, dtype=np.int64)
        n, tiny = scan_bounded(v, s, k[0], k[1], *consts, use_m, r, idx)
    return r, idx[:n], bool(tiny)
