"""bfloat16 rounding sites (SPEC VI §2): rounding, boundary distance and neighbours.

Under ``train.precision = "bf16"`` (autocast), covered operations on bfloat16 inputs produce
bfloat16 outputs: their float64 values round **directly** to bfloat16 (8 significant bits,
float32's exponent range), to nearest, ties to even. Values are carried as float32 arrays
holding bfloat16 numbers (exact: every bfloat16 is a float32).

Direct rounding is computed without double rounding: round to float32 *to odd* (truncate, then
set the last bit if anything was cut), then round that float32 to nearest-even at bfloat16's
precision (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved
algorithms using rounding to odd", 2008: 24 ≥ 8 + 2 bits).
"""

from __future__ import annotations

import numpy as np

MANT = 7  # bfloat16 fraction bits (float32: 23)
_HALF = 1 << 28
_LOW = (1 << 45) - 1  # float64 bits below bfloat16's last bit: 52 - 7 = 45
_TINY = 2.0**-125  # below: the bfloat16 gap is its subnormal spacing 2^-133
_SUB = 2.0**-133


def rne(v: np.ndarray) -> np.ndarray:
    """float64 values rounded to nearest bfloat16 (ties to even), as float32; zeros are +0.

    >>> rne(np.array([1.0 + 2.0**-8, 1.0 + 2.0**-8 + 2.0**-40, -0.0, 3.0e38]))
    array([1.       , 1.0078125, 0.       ,       inf], dtype=float32)
    """
    v = np.ascontiguousarray(v, dtype=np.float64).reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        r = v.astype(np.float32)  # nearest float32, ties to even
        fin = np.isfinite(r)
        away = fin & (np.abs(r.astype(np.float64)) > np.abs(v))
        r = np.where(away, np.nextafter(r, np.float32(0.0)), r)  # now truncated toward zero
        inexact = fin & (r.astype(np.float64) != v)
    bits = r.view(np.uint32).astype(np.uint64)
    bits |= inexact.astype(np.uint64)  # round to odd
    lsb = (bits >> 16) & 1
    rounded = (bits + 0x7FFF + lsb) & 0xFFFF0000  # may carry into the exponent: infinity
    nan = np.isnan(r)
    bits = np.where(fin, rounded, bits & 0xFFFF0000)
    bits = np.where(nan, np.uint64(0x7FC00000), bits)
    out: np.ndarray = bits.astype(np.uint32).view(np.float32) + np.float32(0.0)
    return out


def distance(v: np.ndarray) -> np.ndarray:
    """Distance of float64 values to their bfloat16 rounding boundary, in 2^-29 bfloat16 gaps.

    ``0``: the midpoint of two bfloat16 neighbours; ``2**28``: representable, zero, not finite,
    or rounding to infinity (SPEC VI §2 with bfloat16's gap).

    >>> distance(np.array([1.0, 1.0 + 2.0**-8, 1.0 + 2.0**-8 + 2.0**-24]))
    array([268435456,         0,      4096])
    """
    v = np.ascontiguousarray(v, dtype=np.float64).reshape(-1)
    d: np.ndarray = np.abs((v.view(np.int64) & _LOW) - (1 << 44)) >> 16
    a = np.abs(v)
    tiny = a < _TINY
    if tiny.any():
        x = a[tiny] / _SUB
        d[tiny] = np.floor(np.abs((x - np.floor(x)) - 0.5) * 2.0**29).astype(np.int64)
    bad = ~np.isfinite(rne(v)) | (v == 0)
    d[bad] = _HALF
    return d


def step(r: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The next bfloat16 above (``up``) or below each finite bfloat16 ``r`` (float32 arrays)."""
    bits = r.view(np.uint32).astype(np.int64)
    neg = (bits >> 31) == 1
    mag = bits & 0x7FFFFFFF
    zero = mag == 0
    away = (up != neg) | zero
    mag = np.where(away, mag + 0x10000, mag - 0x10000)
    sign = np.where(zero, ~up, neg).astype(np.int64)
    out: np.ndarray = ((sign << 31) | mag).astype(np.uint32).view(np.float32)
    return out


def neighbour(r: np.ndarray, v: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The bfloat16 neighbour of each ``v`` on the side ``up`` (True: the smallest ``>= v``),
    given ``r``, its nearest bfloat16; zeros are +0."""
    above = r.astype(np.float64) > v
    below = r.astype(np.float64) < v
    out = np.where(up, np.where(below, step(r, np.ones_like(up)), r),
                   np.where(above, step(r, np.zeros_like(up)), r))  # fmt: skip
    res: np.ndarray = out.astype(np.float32) + np.float32(0.0)
    return res
