"""One-pass rounding scan of a float64 site (Numba): float32 rounding plus boundary candidates.

Equivalent to ``r = v.astype(float32)`` and ``flatnonzero(((bits(v) - lo) & (2^29 - 1)) <=
width)`` (SPEC VI §2's bit test), fused into one pass; LLVM's ``fptrunc`` rounds to nearest,
ties to even, as IEEE-754 and NumPy do. ``fastmath`` is off.
"""

from __future__ import annotations

import numba
import numpy as np

M29 = (1 << 29) - 1
TINY = 2.0**-125


@numba.njit(cache=True, nogil=True)
def scan_site(v, r, lo, width, idx):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    """Fill ``r``; write candidate indices into ``idx``; return (count, any tiny nonzero)."""
    bits = v.view(np.int64)
    n = 0
    tiny = False
    cap = idx.size
    for i in range(v.size):
        x = v[i]
        r[i] = np.float32(x)
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
