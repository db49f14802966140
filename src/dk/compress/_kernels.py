"""Numba CPU kernels, twins of :mod:`dk.compress.reference` (same signatures, same bits).

This is the only module of dk that imports numba's CPU compiler. Every kernel is compiled
with ``cache=True`` and ``fastmath=False`` (IEEE float32 arithmetic, no reassociation), runs on
one thread, and writes into caller-owned arrays.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

_JIT: dict[str, Any] = {"cache": True, "nogil": True, "fastmath": False, "boundscheck": False}

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_HI_BITS = 16  # radix select: first pass on key >> 15 (65536 bins), second on key & 0x7FFF


@numba.njit(**_JIT)
def _splitmix(seed: np.uint64, c: np.uint64) -> np.uint64:
    z = seed + (c + np.uint64(1)) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@numba.njit(**_JIT)
def _uniform(seed: np.uint64, c: np.uint64) -> np.float32:
    return np.float32(_splitmix(seed, c) >> np.uint64(40)) * np.float32(2.0**-24)


@numba.njit(**_JIT)
def _rng_numba(seed, counter, out):
    s = np.uint64(seed)
    c = np.uint64(counter)
    for i in range(out.size):
        out[i] = _splitmix(s, c + np.uint64(i))


def rng_numba(seed, counter, out):
    """Numba twin of :func:`dk.compress.reference.rng_reference`."""
    return _rng_numba(np.uint64(seed), np.uint64(counter), out)


@numba.njit(**_JIT)
def _uniform_numba(seed, counter, out):
    s = np.uint64(seed)
    c = np.uint64(counter)
    for i in range(out.size):
        out[i] = _uniform(s, c + np.uint64(i))


def uniform_numba(seed, counter, out):
    """Numba twin of :func:`dk.compress.reference.uniform_reference`."""
    return _uniform_numba(np.uint64(seed), np.uint64(counter), out)


@numba.njit(**_JIT)
def topk_exact_numba(x, k, out_idx, out_val):
    """Numba twin of :func:`dk.compress.reference.topk_exact_reference`."""
    n = x.size
    k = min(max(k, 0), n)
    if k == 0:
        return 0
    keys = x.view(np.uint32)
    shift = 31 - _HI_BITS
    hist = np.zeros(1 << _HI_BITS, dtype=np.int32)
    for i in range(n):
        hist[(keys[i] & 0x7FFFFFFF) >> shift] += 1
    # bin b holds the k-th largest key; `above` elements lie in higher bins
    above = 0
    b = (1 << _HI_BITS) - 1
    while above + hist[b] < k:
        above += hist[b]
        b -= 1
    cand = np.empty(hist[b], dtype=np.int64)
    # pass 2: higher bins go straight to out_idx[:above] (index order); bin b to cand
    a = 0
    c = 0
    for i in range(n):
        h = (keys[i] & 0x7FFFFFFF) >> shift
        if h > b:
            out_idx[a] = i
            a += 1
        elif h == b:
            cand[c] = i
            c += 1
    need = k - above
    low = np.zeros(1 << shift, dtype=np.int64)
    for j in range(c):
        low[keys[cand[j]] & ((1 << shift) - 1)] += 1
    t = (1 << shift) - 1
    got = 0
    while got + low[t] < need:
        got += low[t]
        t -= 1
    ties = need - got  # taken from key == (b, t), lowest indices first
    m = 0
    for j in range(c):
        lo = keys[cand[j]] & ((1 << shift) - 1)
        if lo > t:
            cand[m] = cand[j]
            m += 1
        elif lo == t and ties > 0:
            cand[m] = cand[j]
            m += 1
            ties -= 1
    # merge the two increasing lists out_idx[:above] and cand[:need] from the back
    i1 = above - 1
    i2 = need - 1
    for w in range(k - 1, -1, -1):
        if i2 < 0 or (i1 >= 0 and out_idx[i1] > cand[i2]):
            out_idx[w] = out_idx[i1]
            i1 -= 1
        else:
            out_idx[w] = cand[i2]
            i2 -= 1
    for w in range(k):
        out_val[w] = x[out_idx[w]]
    return k


@numba.njit(**_JIT)
def _sample_threshold_numba(x, k, n_samples, seed, counter):
    n = x.size
    m = min(n_samples, n)
    keys = x.view(np.uint32)
    sample = np.empty(m, dtype=np.uint32)
    s = np.uint64(seed)
    c = np.uint64(counter)
    nn = np.uint64(n)
    for j in range(m):
        pos = ((_splitmix(s, c + np.uint64(j)) >> np.uint64(32)) * nn) >> np.uint64(32)
        sample[j] = keys[np.int64(pos)] & 0x7FFFFFFF
    sample.sort()
    ks = max(1, -(-m * k // n))
    return np.int64(sample[m - ks])


def sample_threshold_numba(x, k, n_samples, seed, counter):
    """Numba twin of :func:`dk.compress.reference.sample_threshold_reference`."""
    return _sample_threshold_numba(x, k, n_samples, np.uint64(seed), np.uint64(counter))


@numba.njit(**_JIT)
def select_threshold_numba(x, thr, out_idx, out_val):
    """Numba twin of :func:`dk.compress.reference.select_threshold_reference`."""
    keys = x.view(np.uint32)
    cap = out_idx.size
    t = np.uint32(thr)
    count = 0
    for i in range(x.size):
        if (keys[i] & 0x7FFFFFFF) >= t:
            if count < cap:
                out_idx[count] = i
                out_val[count] = x[i]
            count += 1
    return count


@numba.njit(**_JIT)
def _quantize_sym(x, block, qmax, out_q, out_scale):
    n = x.size
    fq = np.float32(qmax)
    for b in range((n + block - 1) // block):
        lo = b * block
        hi = min(lo + block, n)
        amax = np.float32(0.0)
        for i in range(lo, hi):
            v = abs(x[i])
            if v > amax:
                amax = v
        s = np.float32(amax / fq)
        out_scale[b] = s
        if s == 0:
            for i in range(lo, hi):
                out_q[i] = 0
        else:
            for i in range(lo, hi):
                r = np.rint(np.float32(x[i] / s))
                out_q[i] = np.int8(min(max(r, -fq), fq))


@numba.njit(**_JIT)
def quantize_int8_numba(x, block, out_q, out_scale):
    """Numba twin of :func:`dk.compress.reference.quantize_int8_reference`."""
    _quantize_sym(x, block, 127, out_q, out_scale)


@numba.njit(**_JIT)
def dequantize_int8_numba(q, scale, block, out):
    """Numba twin of :func:`dk.compress.reference.dequantize_int8_reference`."""
    for i in range(q.size):
        out[i] = np.float32(q[i]) * scale[i // block]


@numba.njit(**_JIT)
def quantize_int4_numba(x, block, out_packed, out_scale):
    """Numba twin of :func:`dk.compress.reference.quantize_int4_reference`."""
    n = x.size
    if n == 0:
        return
    tmp = np.empty(n + (n & 1), dtype=np.int8)
    tmp[-1] = 0
    _quantize_sym(x, block, 7, tmp, out_scale)
    for j in range(out_packed.size):
        out_packed[j] = np.uint8(tmp[2 * j] & 0x0F) | np.uint8((tmp[2 * j + 1] & 0x0F) << 4)


@numba.njit(**_JIT)
def dequantize_int4_numba(packed, scale, block, out):
    """Numba twin of :func:`dk.compress.reference.dequantize_int4_reference`."""
    for i in range(out.size):
        byte = np.int32(packed[i >> 1])
        nib = (byte >> 4) if (i & 1) else (byte & 0x0F)
        if nib >= 8:
            nib -= 16
        out[i] = np.float32(nib) * scale[i // block]


@numba.njit(**_JIT)
def _quantize_qsgd_numba(x, block, levels, seed, counter, out_q, out_scale):
    n = x.size
    fl_levels = np.float32(levels)
    s = np.uint64(seed)
    c = np.uint64(counter)
    for b in range((n + block - 1) // block):
        lo = b * block
        hi = min(lo + block, n)
        amax = np.float32(0.0)
        for i in range(lo, hi):
            v = abs(x[i])
            if v > amax:
                amax = v
        out_scale[b] = amax
        for i in range(lo, hi):
            u = _uniform(s, c + np.uint64(i))
            if amax == 0:
                t = np.float32(0.0)
            else:
                t = np.float32(np.float32(abs(x[i]) / amax) * fl_levels)
            f = np.float32(np.floor(t))
            q = np.int8(f) + np.int8(u < np.float32(t - f))
            out_q[i] = -q if x[i] < 0 else q


def quantize_qsgd_numba(x, block, levels, seed, counter, out_q, out_scale):
    """Numba twin of :func:`dk.compress.reference.quantize_qsgd_reference`."""
    return _quantize_qsgd_numba(
        x, block, levels, np.uint64(seed), np.uint64(counter), out_q, out_scale
    )


@numba.njit(**_JIT)
def dequantize_qsgd_numba(q, scale, block, levels, out):
    """Numba twin of :func:`dk.compress.reference.dequantize_qsgd_reference`."""
    fl_levels = np.float32(levels)
    for i in range(q.size):
        out[i] = np.float32(q[i]) * np.float32(scale[i // block] / fl_levels)
