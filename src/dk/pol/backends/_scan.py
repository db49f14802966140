"""One-pass rounding scan of a float64 site (Numba): float32 rounding plus boundary candidates.

Equivalent to ``r = v.astype(float32) + float32(0)`` (a zero rounds to +0, SPEC VI §2) and
``flatnonzero(((bits(v) - lo) & (2^29 - 1)) <= width)`` (SPEC VI §2's bit test), fused into one
pass; LLVM's ``fptrunc`` rounds to nearest,
ties to even, as IEEE-754 and NumPy do. ``fastmath`` is off.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

M29 = (1 << 29) - 1
TINY = 2.0**-125
HALF = 1 << 28
# the float32 gap of a normal float64 by its biased exponent field (SPEC VI §2)
GAPS = np.ldexp(1.0, np.arange(2048) - 1023 - 23)


class Outer(NamedTuple):
    """``s`` of a matrix product's site ``(…, m, n)`` as factors: element ``(b, i, j)`` has
    ``rows[b·m + i] · cols[b·n + j] (+ c[j])`` (float64, flat; ``c`` empty: no term)."""

    rows: np.ndarray
    cols: np.ndarray
    c: np.ndarray
    m: int
    n: int

    def at(self, idx: np.ndarray) -> np.ndarray:
        """``s`` of the flat elements ``idx``, as the scan computes it."""
        j = idx % self.n
        s: np.ndarray = (
            self.rows[idx // self.n] * self.cols[(idx // (self.m * self.n)) * self.n + j]
        )
        if self.c.size:
            s = s + self.c[j]
        return s


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
def _flagged(x, b, s_i, gamma, k, c_rec, c_miss, t_cap, m_cap, use_m):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Whether finite, normal, nonzero ``x`` (bits ``b``, already past the cap's bit test) lies
    within its threshold from ``s_i`` (SPEC VI §2; :func:`dk.pol.backends.bounds.thresholds`'
    formula, in the same order of float64 operations)."""
    d = abs((b & M29) - HALF)
    gap = GAPS[(b >> 52) & 0x7FF]  # 2^(e - 23) for |x| in [2^e, 2^(e+1))
    beta = gamma * (s_i * (1.0 + k * 2.0**-23) + k * 2.0**-149) * 2.0**29 / gap
    if use_m:
        thr = min(c_miss * beta, float(m_cap)) if beta == beta else float(m_cap)
    else:
        thr = min(c_rec * beta + 2.0, float(t_cap)) if beta == beta else float(t_cap)
    return d <= thr


@numba.njit(cache=True, nogil=True)
def _bounded_consts(kg, t_cap, m_cap, use_m):  # type: ignore[no-untyped-def]  # pragma: no cover
    """``(γ_K', lo, width)``: the error factor of a ``K'``-term sum and the bit test of the cap
    (``t_cap``, or ``m_cap`` when checking) that every bounded scan starts from."""
    gamma = kg * 2.0**-53 / (1.0 - kg * 2.0**-53)
    lo = HALF - (m_cap if use_m else t_cap)
    width = 2 * (m_cap if use_m else t_cap)
    return gamma, lo, width


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
    gamma, lo, width = _bounded_consts(kg, t_cap, m_cap, use_m)
    for i in range(v.size):
        x = v[i]
        r[i] = np.float32(x) + np.float32(0.0)  # a zero is +0 (SPEC VI §2)
        if x != 0.0 and abs(x) < TINY:
            tiny = True
            continue
        if ((bits[i] - lo) & M29) > width or not np.isfinite(np.float32(x)) or x == 0.0:
            continue
        if _flagged(x, bits[i], s[i], gamma, k, c_rec, c_miss, t_cap, m_cap, use_m):
            if n < cap:
                idx[n] = i
            n += 1
    return n, tiny


@numba.njit(cache=True, nogil=True)
def scan_bounded_outer(v, rows, cols, c, m, nc, k, kg, c_rec, c_miss, t_cap, m_cap, use_m, r, idx):  # type: ignore[no-untyped-def]  # pragma: no cover
    """:func:`scan_bounded` of a matrix product's site (``(…, m, nc)`` flat) whose ``s`` is
    ``rows[…, i] * cols[…, j] (+ c[j])``: the same products and sums as the array
    :meth:`dk.pol.backends.normbounds._ProductBound.s_upper` holds, computed where an element
    passes the cap's bit test instead of written whole (``c`` empty: no term)."""
    bits = v.view(np.int64)
    n = 0
    tiny = False
    cap = idx.size
    gamma, lo, width = _bounded_consts(kg, t_cap, m_cap, use_m)
    has_c = c.size > 0
    i = 0
    for rb in range(v.size // nc):  # row rb = bi·m + r of the batch of (m, nc) matrices
        row = rows[rb]
        cb = (rb // m) * nc
        for j in range(nc):
            x = v[i]
            r[i] = np.float32(x) + np.float32(0.0)  # a zero is +0 (SPEC VI §2)
            if x != 0.0 and abs(x) < TINY:
                tiny = True
            elif not (((bits[i] - lo) & M29) > width or not np.isfinite(np.float32(x)) or x == 0.0):
                s_i = row * cols[cb + j]
                if has_c:
                    s_i = s_i + c[j]
                if _flagged(x, bits[i], s_i, gamma, k, c_rec, c_miss, t_cap, m_cap, use_m):
                    if n < cap:
                        idx[n] = i
                    n += 1
            i += 1
    return n, tiny


def bounded_scan(
    v: np.ndarray,
    s: np.ndarray | Outer,
    k: tuple[int, int],
    consts: tuple[float, float, int, int],
    use_m: bool,
) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(float32 rounding, indices within t_e (use_m: m_e), any tiny nonzero)`` of ``v``;
    ``s`` is ``S`` (or an upper bound) of each element, or an :class:`Outer` that gives it;
    ``k`` is ``(K, K')``: the site's term count and its blocked sum's (SPEC VI §2)."""
    r = np.empty(v.size, dtype=np.float32)
    idx = np.empty(max(64, v.size >> 6), dtype=np.int64)
    for _ in range(2):  # a second pass only if the first found more than idx holds
        if isinstance(s, Outer):
            n, tiny = scan_bounded_outer(
                v, s.rows, s.cols, s.c, s.m, s.n, k[0], k[1], *consts, use_m, r, idx
            )
        else:
            n, tiny = scan_bounded(v, s, k[0], k[1], *consts, use_m, r, idx)
        if n <= idx.size:
            break
        idx = np.empty(n, dtype=np.int64)
    return r, idx[:n], bool(tiny)
