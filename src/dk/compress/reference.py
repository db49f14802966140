"""NumPy reference kernels of the gradient codecs (SPEC.md Part III §3).

Every function here has a twin in :mod:`dk.compress._kernels` (Numba CPU) with the same name
suffix ``_numba`` and the same signature; some also have a CUDA twin in
:mod:`dk.compress._cuda`. The references define the results: the fast kernels must agree with
them bit for bit. Kernels write into caller-owned output arrays and return only small scalars.

Conventions shared by every kernel:

- inputs are 1-D C-contiguous ``float32`` arrays;
- the *key* of an element is the bit pattern of ``|x|``, ``x.view(uint32) & 0x7FFFFFFF``, which
  orders finite values and infinities by magnitude (NaN ranks above +inf, -0 equals +0);
- blocks are consecutive runs of ``block`` elements, the last one possibly shorter;
- random numbers come from the counter-based SplitMix64 generator of :func:`rng_reference`.
"""

from __future__ import annotations

import numpy as np

KEY_MASK = np.uint32(0x7FFFFFFF)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
INT8_MAX = 127
INT4_MAX = 7


def rng_reference(seed: int, counter: int, out: np.ndarray) -> None:
    """Fill ``out`` (uint64) with SplitMix64 outputs for counters ``counter, counter+1, ...``.

    ``out[i] = mix(seed + (counter + i + 1) * GOLDEN mod 2**64)`` (spec §3.1).

    Args:
        seed: generator seed, ``0 <= seed < 2**64``.
        counter: counter of ``out[0]``, ``0 <= counter < 2**64``.
        out: uint64 array to fill.
    """
    n = out.size
    with np.errstate(over="ignore"):
        c = np.arange(n, dtype=np.uint64) + np.uint64(counter) + np.uint64(1)
        z = np.uint64(seed) + c * GOLDEN
        z = (z ^ (z >> np.uint64(30))) * MIX1
        z = (z ^ (z >> np.uint64(27))) * MIX2
        out[:] = z ^ (z >> np.uint64(31))


def uniform_reference(seed: int, counter: int, out: np.ndarray) -> None:
    """Fill ``out`` (float32) with uniforms in [0, 1): ``(z >> 40) * 2**-24`` (spec §3.1).

    Args:
        seed: generator seed.
        counter: counter of ``out[0]``.
        out: float32 array to fill.
    """
    z = np.empty(out.size, dtype=np.uint64)
    rng_reference(seed, counter, z)
    out[:] = (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)


def _keys(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint32) & KEY_MASK


def topk_exact_reference(x: np.ndarray, k: int, out_idx: np.ndarray, out_val: np.ndarray) -> int:
    """Select the ``k`` elements of largest magnitude (spec §3.2).

    Ties at the threshold are broken by index: the lower index wins. The selected indices are
    written in increasing order to ``out_idx[:k]`` (uint32) and their values to ``out_val[:k]``.

    Args:
        x: float32 input.
        k: number of elements to select (clamped to ``[0, x.size]``).
        out_idx: uint32 output of at least ``min(k, x.size)`` entries.
        out_val: float32 output of the same size.

    Returns:
        The number of entries written, ``min(max(k, 0), x.size)``.
    """
    n = x.size
    k = min(max(int(k), 0), n)
    if k == 0:
        return 0
    keys = _keys(x)
    thr = np.partition(keys, n - k)[n - k]  # the k-th largest key
    above = np.flatnonzero(keys > thr)
    ties = np.flatnonzero(keys == thr)[: k - above.size]
    idx = np.sort(np.concatenate([above, ties]))
    out_idx[:k] = idx
    out_val[:k] = x[idx]
    return k


def sample_threshold_reference(
    x: np.ndarray, k: int, n_samples: int, seed: int, counter: int
) -> int:
    """Estimate the key of the k-th largest element from a random sample (DGC, spec §3.3).

    Sample ``m = min(n_samples, n)`` positions ``j = (hi32(z) * n) >> 32`` with generator
    counters ``counter .. counter+m-1``; return the ``ceil(m*k/n)``-th largest sampled key.

    Args:
        x: float32 input (non-empty).
        k: target number of selected elements, ``1 <= k <= x.size``.
        n_samples: sample size.
        seed: generator seed.
        counter: generator counter of the first sample.

    Returns:
        The threshold key (an int in ``[0, 2**31)``).
    """
    n = x.size
    m = min(n_samples, n)
    z = np.empty(m, dtype=np.uint64)
    rng_reference(seed, counter, z)
    pos = ((z >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32)
    sample = np.sort(_keys(x)[pos.astype(np.int64)])
    ks = max(1, -(-m * k // n))
    return int(sample[m - ks])


def select_threshold_reference(
    x: np.ndarray, thr: int, out_idx: np.ndarray, out_val: np.ndarray
) -> int:
    """Write the elements whose key is ``>= thr`` in index order, up to the buffer size.

    Args:
        x: float32 input.
        thr: threshold key.
        out_idx: uint32 output; its size is the capacity.
        out_val: float32 output of the same size.

    Returns:
        The total number of elements with key ``>= thr`` (may exceed the capacity; then only
        the first ``capacity`` of them, by index, are written).
    """
    idx = np.flatnonzero(_keys(x) >= np.uint32(thr))
    m = min(idx.size, out_idx.size)
    out_idx[:m] = idx[:m]
    out_val[:m] = x[idx[:m]]
    return int(idx.size)


def _block_absmax(x: np.ndarray, block: int) -> np.ndarray:
    n = x.size
    nb = -(-n // block)
    pad = np.zeros(nb * block, dtype=np.float32)
    pad[:n] = np.abs(x)
    return pad.reshape(nb, block).max(axis=1)


def _per_element(values: np.ndarray, block: int, n: int) -> np.ndarray:
    return np.repeat(values, block)[:n]


def quantize_int8_reference(
    x: np.ndarray, block: int, out_q: np.ndarray, out_scale: np.ndarray
) -> None:
    """Symmetric int8 block quantization (spec §3.4).

    ``scale = absmax(block) / 127``; ``q = clip(rint(x / scale), -127, 127)``; a block whose
    scale is 0 quantizes to zeros. Input must be finite.

    Args:
        x: float32 input of n elements.
        block: block size (>= 1).
        out_q: int8 output of n elements.
        out_scale: float32 output of ``ceil(n / block)`` elements.
    """
    _quantize_sym(x, block, INT8_MAX, out_q, out_scale)


def _quantize_sym(
    x: np.ndarray, block: int, qmax: int, out_q: np.ndarray, out_scale: np.ndarray
) -> None:
    n = x.size
    scale = _block_absmax(x, block) / np.float32(qmax)
    out_scale[:] = scale
    s = _per_element(scale, block, n)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(x / s)
    q = np.where(s == 0, np.float32(0), np.clip(q, -qmax, qmax))
    out_q[:n] = q.astype(np.int8)


def dequantize_int8_reference(
    q: np.ndarray, scale: np.ndarray, block: int, out: np.ndarray
) -> None:
    """Inverse of :func:`quantize_int8_reference`: ``out = q * scale`` (float32).

    Args:
        q: int8 codes.
        scale: float32 per-block scales.
        block: block size.
        out: float32 output of ``q.size`` elements.
    """
    out[:] = q.astype(np.float32) * _per_element(scale, block, q.size)


def quantize_int4_reference(
    x: np.ndarray, block: int, out_packed: np.ndarray, out_scale: np.ndarray
) -> None:
    """Symmetric int4 block quantization, two codes per byte (spec §3.4).

    As int8 with ``qmax = 7``; code ``i`` goes to the low nibble of byte ``i // 2`` when ``i``
    is even, the high nibble otherwise, as a 4-bit two's complement value; an unused final
    high nibble is 0.

    Args:
        x: float32 input of n elements.
        block: block size (>= 1).
        out_packed: uint8 output of ``ceil(n / 2)`` bytes.
        out_scale: float32 output of ``ceil(n / block)`` elements.
    """
    n = x.size
    q = np.empty(n + (n & 1), dtype=np.int8)
    q[n:] = 0
    _quantize_sym(x, block, INT4_MAX, q, out_scale)
    nib = q.view(np.uint8) & np.uint8(0x0F)
    out_packed[:] = nib[0::2] | (nib[1::2] << np.uint8(4))


def dequantize_int4_reference(
    packed: np.ndarray, scale: np.ndarray, block: int, out: np.ndarray
) -> None:
    """Inverse of :func:`quantize_int4_reference`.

    Args:
        packed: uint8 packed codes.
        scale: float32 per-block scales.
        block: block size.
        out: float32 output of n elements.
    """
    n = out.size
    q = np.empty(2 * packed.size, dtype=np.int8)
    q[0::2] = (packed << np.uint8(4)).view(np.int8) >> 4
    q[1::2] = packed.view(np.int8) >> 4
    out[:] = q[:n].astype(np.float32) * _per_element(scale, block, n)


def quantize_qsgd_reference(
    x: np.ndarray,
    block: int,
    levels: int,
    seed: int,
    counter: int,
    out_q: np.ndarray,
    out_scale: np.ndarray,
) -> None:
    """Stochastic (QSGD) quantization with a per-block max-norm (spec §3.5).

    ``t = (|x| / absmax) * levels``; ``q = floor(t) + (u < t - floor(t))`` with ``u`` the
    uniform of counter ``counter + i`` for element ``i``; the code is ``sign(x) * q``.

    Args:
        x: float32 input of n elements (finite).
        block: block size (>= 1).
        levels: number of levels, ``1 <= levels <= 127``.
        seed: generator seed.
        counter: generator counter of element 0 (the call consumes n counters).
        out_q: int8 output of n codes.
        out_scale: float32 output: per-block absmax.
    """
    n = x.size
    amax = _block_absmax(x, block)
    out_scale[:] = amax
    a = _per_element(amax, block, n)
    u = np.empty(n, dtype=np.float32)
    uniform_reference(seed, counter, u)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (np.abs(x) / a) * np.float32(levels)
    t = np.where(a == 0, np.float32(0), t)
    fl = np.floor(t)
    q = fl + (u < (t - fl)).astype(np.float32)
    out_q[:] = np.where(x < 0, -q, q).astype(np.int8)


def dequantize_qsgd_reference(
    q: np.ndarray, scale: np.ndarray, block: int, levels: int, out: np.ndarray
) -> None:
    """Inverse of :func:`quantize_qsgd_reference`: ``out = q * (absmax / levels)``.

    Args:
        q: int8 codes.
        scale: float32 per-block absmax.
        block: block size.
        levels: number of levels.
        out: float32 output.
    """
    step = scale / np.float32(levels)
    out[:] = q.astype(np.float32) * _per_element(step, block, q.size)
