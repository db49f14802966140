"""Vector arithmetic over the secure-aggregation field F_p (SPEC §VII.2), NumPy reference.

``p = 2**32 - 5`` (the largest prime below 2**32). Field elements are held in ``uint64``
arrays, so a sum of two elements never overflows. Each function writes into a caller-owned
``out`` array; :mod:`dk.fl._kernels` holds Numba twins with the same signatures, and
:func:`field_kernel` picks one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

P = 4294967291  # 2**32 - 5, prime
HALF = P // 2


def add_reference(acc: np.ndarray, x: np.ndarray, p: int, out: np.ndarray) -> None:
    """``out = (acc + x) mod p`` elementwise (operands already reduced)."""
    s = acc + x
    np.subtract(s, np.uint64(p), out=s, where=s >= np.uint64(p))
    out[...] = s


def sub_reference(acc: np.ndarray, x: np.ndarray, p: int, out: np.ndarray) -> None:
    """``out = (acc - x) mod p`` elementwise (operands already reduced)."""
    s = acc + (np.uint64(p) - x)
    np.subtract(s, np.uint64(p), out=s, where=s >= np.uint64(p))
    out[...] = s


def quantize_reference(x: np.ndarray, scale: float, clip: float, p: int, out: np.ndarray) -> None:
    """``out = rint(clamp(x, -clip, clip) * scale) mod p`` (float64 arithmetic, half to even)."""
    q = np.rint(np.clip(x.astype(np.float64), -clip, clip) * scale).astype(np.int64)
    q[q < 0] += p
    out[...] = q.astype(np.uint64)


def dequantize_reference(s: np.ndarray, scale: float, p: int, out: np.ndarray) -> None:
    """Signed lift of ``s`` (``s > p // 2`` means ``s - p``) divided by ``scale``."""
    v = s.astype(np.int64)
    v[s > np.uint64(p // 2)] -= p
    out[...] = v.astype(np.float64) / scale


def words_to_field(words: np.ndarray, p: int) -> np.ndarray:
    """Rejection sampling: keep the little-endian uint32 words below ``p`` (uniform on F_p)."""
    return words[words < np.uint32(p)].astype(np.uint64)


def reject_reference(words: np.ndarray, p: int, out: np.ndarray, start: int) -> int:
    """Copy the words below ``p``, in order, into ``out[start:]`` until it is full; returns
    the new fill level (rejection sampling to F_p, SPEC §VII.2)."""
    kept = words_to_field(words, p)[: out.size - start]
    out[start : start + kept.size] = kept
    return start + int(kept.size)


KERNELS = ("add", "sub", "quantize", "dequantize", "reject")


def field_kernel(name: str, backend: str = "numba") -> Callable[..., Any]:
    """The ``name`` kernel (``add``, ``sub``, ``quantize``, ``dequantize``, ``reject``)."""
    if name not in KERNELS:
        raise ValueError(f"unknown field kernel {name!r}")
    if backend == "reference":
        return globals()[f"{name}_reference"]  # type: ignore[no-any-return]
    if backend == "numba":
        from dk.fl import _kernels

        return getattr(_kernels, f"{name}_numba")  # type: ignore[no-any-return]
    raise ValueError(f"unknown backend {backend!r}")


def quantize(
    x: np.ndarray, *, scale: float, clip: float, n: int, p: int = P, backend: str = "numba"
) -> np.ndarray:
    """Field encoding of a float update for a sum over ``n`` clients (SPEC §VII.2).

    Raises:
        ValueError: ``n * clip * scale`` could wrap around ``p // 2`` (the sum would not decode).
    """
    if not (scale > 0 and clip > 0) or n * (clip * scale + 1) > p // 2:
        raise ValueError(f"n·clip·scale = {n * clip * scale:g} does not fit below p/2 = {p // 2}")
    out = np.empty(x.size, dtype=np.uint64)
    field_kernel("quantize", backend)(np.ascontiguousarray(x).reshape(-1), scale, clip, p, out)
    return out


def dequantize(s: np.ndarray, *, scale: float, p: int = P, backend: str = "numba") -> np.ndarray:
    """The float64 value of a field sum (signed lift, divided by ``scale``)."""
    out = np.empty(s.size, dtype=np.float64)
    field_kernel("dequantize", backend)(s, scale, p, out)
    return out
