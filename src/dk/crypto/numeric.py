"""Fixed-order binary64 sums for numbers that are hashed, signed or decide a verdict (SPEC §1.4).

A BLAS dot product (``np.dot``, ``np.linalg.norm``, ``@``) or ``np.sum`` adds in an order that
depends on the CPU's SIMD width and the library build, so the same vector can sum to different
bits on two machines. Every such number in dk is instead a **fold sum**: while more than one
term is left, the last ``h = floor(n / 2)`` terms are added elementwise onto the first ``h``.
Each step is one elementwise IEEE-754 addition, which NumPy performs with the same rounding on
every machine, so the result is a function of the input bits alone; it costs about one pass
over the data (as fast as ``np.dot`` on 10^7 elements).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

__all__ = ["fold_sum", "fold_sum_inplace", "model_update_norm", "squared_diffs"]


def fold_sum_inplace(v: np.ndarray) -> float:
    """Fold sum (SPEC §1.4) of a 1-d float64 array, overwriting it.

    ``v[0:h] += v[n-h:n]`` with ``h = n // 2`` until one term is left; the empty sum is +0.0.

    Raises:
        ValueError: unless ``v`` is a 1-d, contiguous, writable float64 array.
    """
    if v.dtype != np.float64 or v.ndim != 1 or not v.flags.c_contiguous or not v.flags.writeable:
        raise ValueError("fold_sum_inplace needs a 1-d contiguous writable float64 array")
    n = v.shape[0]
    if n == 0:
        return 0.0
    while n > 1:
        h = n // 2
        # The two slices never overlap (n - h >= h), so this is h independent additions.
        np.add(v[:h], v[n - h : n], out=v[:h])
        n -= h
    return float(v[0])


def fold_sum(v: np.ndarray) -> float:
    """Fold sum (SPEC §1.4) of the float64 values of ``v`` in row-major order (a copy is summed)."""
    return fold_sum_inplace(np.array(v, dtype=np.float64, order="C").reshape(-1))


def squared_diffs(
    a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], names: Iterable[str]
) -> np.ndarray:
    """``(f64(b[k]) - f64(a[k]))²`` elementwise, concatenated over ``names`` in the given order.

    Raises:
        ValueError: when ``a[k]`` and ``b[k]`` differ in size.
    """
    names = list(names)
    sizes = [int(np.asarray(a[k]).size) for k in names]
    out = np.empty(sum(sizes), dtype=np.float64)
    o = 0
    for k, n in zip(names, sizes, strict=True):
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if y.size != n:
            raise ValueError(f"tensor {k!r} has {y.size} elements, expected {n}")
        seg = out[o : o + n]
        np.subtract(y.reshape(-1), x.reshape(-1), out=seg, dtype=np.float64)
        o += n
    np.multiply(out, out, out=out)
    return out


def model_update_norm(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> float:
    """``sqrt(fold_sum((b - a)²))`` over the ``model/*`` tensors of ``a`` in name order.

    Names sort by code point, which is the UTF-8 byte order of SPEC §4.1; ``sqrt`` is the
    correctly rounded IEEE square root.
    """
    names = sorted(k for k in a if k.startswith("model/"))
    return math.sqrt(fold_sum_inplace(squared_diffs(a, b, names)))
