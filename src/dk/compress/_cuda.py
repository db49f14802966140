"""Numba CUDA kernels: top-k threshold selection, block quantization, the generator.

Host wrappers take and fill NumPy arrays with the signatures of :mod:`dk.compress.reference`
and give the same bits. They run on a GPU, or under Numba's simulator
(``NUMBA_ENABLE_CUDASIM=1``, set before numba is imported) where CI tests them.

Bit-exactness on a GPU: the kernels use only integer arithmetic, comparisons, float32
division (correctly rounded unless fastmath) and one float32 add/sub pair for rounding, so
no multiply-add can be contracted into an FMA.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from numba import cuda

from dk.errors import BackendUnavailable

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_ROUND = np.float32(12582912.0)  # 1.5 * 2**23: (y + R) - R == rint(y) for |y| <= 2**22
_TPB = 128  # threads per block
_CHUNK = 256  # elements per thread in the ordered compaction
_LO_BITS = 15


def require_cuda() -> None:
    """Raise :class:`BackendUnavailable` unless a GPU (or the simulator) is usable."""
    if not cuda.is_available():
        raise BackendUnavailable("no CUDA device (set NUMBA_ENABLE_CUDASIM=1 for the simulator)")


def _blocks(n: int) -> int:
    return max(1, -(-n // _TPB))


@cuda.jit(device=True)
def _splitmix(seed, c):
    z = seed + (c + np.uint64(1)) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@cuda.jit
def _rng_kernel(seed, counter, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = _splitmix(seed[0], counter[0] + np.uint64(i))


def rng_cuda(seed: int, counter: int, out: np.ndarray) -> None:
    """CUDA twin of :func:`dk.compress.reference.rng_reference`."""
    with warnings.catch_warnings():  # the simulator runs this in NumPy scalars, which warn
        warnings.simplefilter("ignore", RuntimeWarning)
        d = cuda.device_array(out.size, dtype=np.uint64)
        s = cuda.to_device(np.array([seed], dtype=np.uint64))
        c = cuda.to_device(np.array([counter], dtype=np.uint64))
        _rng_kernel[_blocks(out.size), _TPB](s, c, d)
        out[:] = d.copy_to_host()


@cuda.jit
def _hist_hi(keys, hist):
    i = cuda.grid(1)
    if i < keys.size:
        cuda.atomic.add(hist, (keys[i] & 0x7FFFFFFF) >> _LO_BITS, 1)


@cuda.jit
def _hist_lo(keys, b, hist):
    i = cuda.grid(1)
    if i < keys.size:
        k = keys[i] & 0x7FFFFFFF
        if (k >> _LO_BITS) == b:
            cuda.atomic.add(hist, k & ((1 << _LO_BITS) - 1), 1)


@cuda.jit
def _count_chunks(keys, thr, gt, eq):
    j = cuda.grid(1)
    if j < gt.size:
        a = 0
        e = 0
        for i in range(j * _CHUNK, min((j + 1) * _CHUNK, keys.size)):
            k = keys[i] & 0x7FFFFFFF
            if k > thr:
                a += 1
            elif k == thr:
                e += 1
        gt[j] = a
        eq[j] = e


@cuda.jit
def _write_chunks(x, keys, thr, ties_left, offset, out_idx, out_val):
    j = cuda.grid(1)
    if j < offset.size:
        w = offset[j]
        t = ties_left[j]  # equal keys this chunk may still take
        for i in range(j * _CHUNK, min((j + 1) * _CHUNK, keys.size)):
            k = keys[i] & 0x7FFFFFFF
            take = k > thr
            if k == thr and t > 0:
                take = True
                t -= 1
            if take:
                if w < out_idx.size:
                    out_idx[w] = i
                    out_val[w] = x[i]
                w += 1


def _compact(x: np.ndarray, d_x, d_keys, thr: int, ties: int, out_idx, out_val) -> int:
    """Write keys > thr and the first ``ties`` keys == thr, in index order; return the count."""
    nchunks = max(1, -(-x.size // _CHUNK))
    gt = cuda.device_array(nchunks, dtype=np.int64)
    eq = cuda.device_array(nchunks, dtype=np.int64)
    _count_chunks[_blocks(nchunks), _TPB](d_keys, np.uint32(thr), gt, eq)
    h_gt, h_eq = gt.copy_to_host(), eq.copy_to_host()
    eq_before = np.cumsum(h_eq) - h_eq
    ties_left = np.clip(ties - eq_before, 0, h_eq)
    sel = h_gt + ties_left
    offset = np.cumsum(sel) - sel
    d_idx = cuda.device_array(out_idx.size, dtype=np.uint32)
    d_val = cuda.device_array(out_val.size, dtype=np.float32)
    _write_chunks[_blocks(nchunks), _TPB](
        d_x, d_keys, np.uint32(thr), cuda.to_device(ties_left), cuda.to_device(offset), d_idx, d_val
    )
    total = int(sel.sum())
    m = min(total, out_idx.size)
    out_idx[:m] = d_idx.copy_to_host()[:m]
    out_val[:m] = d_val.copy_to_host()[:m]
    return total


def topk_exact_cuda(x: np.ndarray, k: int, out_idx: np.ndarray, out_val: np.ndarray) -> int:
    """CUDA twin of :func:`dk.compress.reference.topk_exact_reference` (radix select)."""
    n = x.size
    k = min(max(int(k), 0), n)
    if k == 0:
        return 0
    d_x = cuda.to_device(x)
    d_keys = cuda.to_device(x.view(np.uint32))
    hist = cuda.to_device(np.zeros(1 << 16, dtype=np.int32))
    _hist_hi[_blocks(n), _TPB](d_keys, hist)
    h = hist.copy_to_host()
    above_incl = np.cumsum(h[::-1])  # count of keys in bins >= 65535 - j
    j = int(np.searchsorted(above_incl, k))  # first j where count >= k
    b = (1 << 16) - 1 - j
    above = int(above_incl[j] - h[b])
    low = cuda.to_device(np.zeros(1 << _LO_BITS, dtype=np.int32))
    _hist_lo[_blocks(n), _TPB](d_keys, np.uint32(b), low)
    lo = low.copy_to_host()
    lo_incl = np.cumsum(lo[::-1])
    need = k - above
    jt = int(np.searchsorted(lo_incl, need))
    t = (1 << _LO_BITS) - 1 - jt
    got = int(lo_incl[jt] - lo[t])
    thr = (b << _LO_BITS) | t
    return _compact(x, d_x, d_keys, thr, need - got, out_idx[:k], out_val[:k])


def select_threshold_cuda(x: np.ndarray, thr: int, out_idx: np.ndarray, out_val: np.ndarray) -> int:
    """CUDA twin of :func:`dk.compress.reference.select_threshold_reference`."""
    d_x = cuda.to_device(x)
    d_keys = cuda.to_device(x.view(np.uint32))
    return _compact(x, d_x, d_keys, int(thr), x.size, out_idx, out_val)


@cuda.jit
def _block_scales(x, block, qmax, scale):
    b = cuda.grid(1)
    if b < scale.size:
        amax = np.float32(0.0)
        for i in range(b * block, min((b + 1) * block, x.size)):
            v = abs(x[i])
            if v > amax:
                amax = v
        scale[b] = amax / qmax


@cuda.jit(device=True)
def _code(x, i, block, qmax, scale):
    s = scale[i // block]
    if s == 0:
        return 0
    y = x[i] / s
    r = (y + _ROUND) - _ROUND
    return int(min(max(r, -qmax), qmax))


@cuda.jit
def _codes8(x, block, qmax, scale, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = _code(x, i, block, qmax, scale)


@cuda.jit
def _codes4(x, block, qmax, scale, out):
    j = cuda.grid(1)
    if j < out.size:
        lo = _code(x, 2 * j, block, qmax, scale) & 0x0F
        hi = 0
        if 2 * j + 1 < x.size:
            hi = _code(x, 2 * j + 1, block, qmax, scale) & 0x0F
        out[j] = lo | (hi << 4)


def _quantize(x: np.ndarray, block: int, qmax: int, codes, out_codes, out_scale) -> None:
    nb = max(1, math.ceil(x.size / block)) if x.size else 0
    if x.size == 0:
        return
    d_x = cuda.to_device(x)
    d_s = cuda.device_array(nb, dtype=np.float32)
    fq = np.float32(qmax)
    _block_scales[_blocks(nb), _TPB](d_x, block, fq, d_s)
    d_q = cuda.device_array(out_codes.size, dtype=out_codes.dtype)
    codes[_blocks(out_codes.size), _TPB](d_x, block, fq, d_s, d_q)
    out_scale[:] = d_s.copy_to_host()
    out_codes[:] = d_q.copy_to_host()


def quantize_int8_cuda(x: np.ndarray, block: int, out_q: np.ndarray, out_scale: np.ndarray) -> None:
    """CUDA twin of :func:`dk.compress.reference.quantize_int8_reference`."""
    _quantize(x, block, 127, _codes8, out_q, out_scale)


def quantize_int4_cuda(
    x: np.ndarray, block: int, out_packed: np.ndarray, out_scale: np.ndarray
) -> None:
    """CUDA twin of :func:`dk.compress.reference.quantize_int4_reference`."""
    _quantize(x, block, 7, _codes4, out_packed, out_scale)
