"""bfloat16 rounding sites (SPEC VI §2): rounding, boundary distance and neighbours.

Under ``train.precision = "bf16"`` (autocast), covered operations on bfloat16 inputs produce
bfloat16 outputs: their float64 values round **directly** to bfloat16 (8 significant bits,
float32's exponent range), to nearest, ties to even. Values are carried as float32 arrays
holding bfloat16 numbers (exact: every bfloat16 is a float32).

Direct rounding is computed without double rounding: round to float32 *to odd* (truncate, then
set the last bit if anything was cut), then round that float32 to nearest-even at bfloat16's
precision (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved
algorithms using rounding to odd", 2008: 24 ≥ 8 + 2 bits).

:func:`rne`, :func:`distance` and ``bounds.thresholds(..., mant=MANT)`` are the reference, in
NumPy; :func:`scan` computes the same in two Numba passes per site (the rounded backend's CPU
path), tested against them at the thresholds and on special values. Its rounding is the direct
one on the float64 bits (nearest-even at 7 fraction bits, carries included), which gives the
same bfloat16 as the two steps above for every value in bfloat16's normal range.
"""

from __future__ import annotations

import numba
import numpy as np

MANT = 7  # bfloat16 fraction bits (float32: 23)
_HALF = 1 << 28
_LOW = (1 << 45) - 1  # float64 bits below bfloat16's last bit: 52 - 7 = 45
_MID = 1 << 44  # half of bfloat16's last bit, in those bits: a rounding boundary
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
    d: np.ndarray = np.abs((v.view(np.int64) & _LOW) - _MID) >> 16
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


_GAPS = np.ldexp(1.0, np.arange(2048) - 1023 - MANT)  # bfloat16 gap by float64 exponent field


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _decide(v, s, has_s, k, kg, t_unb, c_rec, c_miss, cap, use_m, idx):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    """Pass 2: write the indices with ``D <= t_e`` (``use_m``: ``D <= m_e``) into ``idx`` and
    return their count, for values pass 1 kept (nonzero, not tiny, rounding to a finite
    bfloat16): :func:`distance`'s and ``thresholds``' operations (the same float64 operations
    in the same order, no fastmath)."""
    bits = v.view(np.int64)
    gamma = kg * 2.0**-53 / (1.0 - kg * 2.0**-53)
    k1, k2 = 1.0 + k * 2.0**-23, k * 2.0**-149
    capf = float(cap)
    n = 0
    for i in range(v.size):
        d = abs((bits[i] & _LOW) - _MID) >> 16
        if has_s:
            gap = _GAPS[(bits[i] >> 52) & 0x7FF]
            beta = gamma * (s[i] * k1 + k2) * 2.0**29 / gap
            if use_m:
                thr = min(c_miss * beta, capf / 2) if beta == beta else capf / 2
            else:
                thr = min(c_rec * beta + 2.0, capf) if beta == beta else capf
        else:
            thr = t_unb / 2 if use_m else t_unb
        if d <= thr:
            idx[n] = i
            n += 1
    return n


_MARGIN = 1.0 + 2.0**-20  # pass 1's slack over its own and _decide's roundings
_NAN32 = np.float32(np.nan)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _keep(v, s, has_s, k, kg, t_unb, coef, add, capw, r, keep):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    """Pass 1, branch-free: ``r`` and ``keep``, a superset of the elements :func:`_decide`
    selects; return whether any value is tiny and nonzero (their ``r`` and ``D`` are the
    caller's). ``r`` is the float64 bits rounded to nearest-even at bfloat16's precision (7
    fraction bits) directly, one rounding, right for ``|v| >= 2^-126`` and infinities (a carry
    past 2^128 gives 2^128, infinite in float32), NaN as ``rne`` writes it, zeros +0. With
    ``S``: for a non-tiny ``x`` in ``[2^e, 2^(e+1))`` the bfloat16 gap is
    ``2^(e-7) > |x|·2^-8``, so ``β < γ·S⁺·2^37/|x|`` and ``D <= c·β + a`` implies
    ``(D - a)·|x| <= c·γ·S⁺·2^37``."""
    bits = v.view(np.int64)
    q = coef * (kg * 2.0**-53 / (1.0 - kg * 2.0**-53)) * 2.0**37 * _MARGIN
    k1, k2 = 1.0 + k * 2.0**-23, k * 2.0**-149
    tiny = False
    for i in range(v.size):
        x, b = v[i], bits[i]
        f = np.float32(np.int64((b + (_MID - 1) + ((b >> 45) & 1)) & ~_LOW).view(np.float64))
        r[i] = (f if x == x else _NAN32) + np.float32(0.0)
        a = abs(x)
        small = a < _TINY
        tiny |= (x != 0.0) & small
        d = np.float64(np.int32(abs((b & _LOW) - _MID) >> 16))
        ok = (x != 0.0) & (~small) & (abs(f) < np.inf) & (d <= capw)
        if has_s:
            far = (d - add) * a > q * (s[i] * k1 + k2)  # False where either side is NaN
            keep[i] = ok & (not far)
        else:
            keep[i] = ok & (d <= t_unb)
    return tiny


def scan(
    v: np.ndarray,
    s: np.ndarray | None,
    k: tuple[int, int],
    t_bits: int,
    consts: tuple[float, float, int],
    use_m: bool,
) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(rne(v), indices with D <= t_e (use_m: m_e), any tiny nonzero)`` of flat contiguous
    float64 ``v``: ``t_e, m_e`` are ``bounds.thresholds(v, s, *k, t_bits, mant=MANT)`` where
    ``s`` is given (``S``, flat float64), else ``t_bits`` and ``t_bits / 2``; ``consts`` is
    ``(C_RECORD, C_MISSING, bound_cap(t_bits))`` of ``bounds``. Tiny nonzero values
    (``|v| < 2^-125``) are not in the indices: the caller decides them with :func:`distance`
    (the returned flag says whether there are any).

    Two passes: :func:`_keep` (branch-free, so that LLVM vectorises it) rounds every element
    and keeps a superset of the selected ones; :func:`_decide` decides the kept ones with
    :func:`distance`'s and ``thresholds``' operations."""
    c_rec, c_miss, cap = consts
    sv = np.zeros(1) if s is None else np.ascontiguousarray(s, dtype=np.float64).reshape(-1)
    if s is not None and sv.size != v.size:  # the kernels read S by the values' index
        raise ValueError(f"bf16.scan: {sv.size} values of S for {v.size} values")
    r = np.empty(v.size, dtype=np.float32)
    keep = np.empty(v.size, dtype=np.bool_)
    coef, add = (c_miss, 0.0) if use_m else (c_rec, 2.0)
    t_unb = t_bits / 2 if use_m else float(t_bits)
    capw = cap / 2 if use_m else float(cap)
    tiny = _keep(v, sv, s is not None, k[0], k[1], t_unb, coef, add, capw, r, keep)
    if tiny:  # below bfloat16's normal range the gap is 2^-133: rne itself
        at = np.flatnonzero((v != 0) & (np.abs(v) < _TINY))
        r[at] = rne(v[at])
    cand = np.flatnonzero(keep)
    sc = sv[cand] if s is not None else sv
    idx = np.empty(cand.size, dtype=np.int64)
    args = (v[cand], sc, s is not None, k[0], k[1], float(t_bits), *consts, use_m)
    n = _decide(*args, idx)
    return r, cand[idx[:n]], bool(tiny)
