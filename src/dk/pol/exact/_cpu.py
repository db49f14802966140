"""Numba CPU kernels of exact mode (SPEC II §3-§5).

Every kernel writes into caller-owned float32 buffers and computes each output element with the
sequence of float32 operations that the spec fixes for it. Work is split across threads only
over independent output elements (``prange`` over rows), so the bits never depend on the thread
count. Kernels are compiled with ``fastmath=False``: LLVM then neither reassociates sums nor
contracts a multiply and an add into an FMA. Vectorisation runs across output elements, never
across the terms of one sum.

Kernels called from Python release the GIL (``nogil=True``), so the Recorder's commit thread
hashes and writes checkpoints while a step computes. Only this module, ``_cuda`` and
``_numba_load`` (the kernels load from Numba's cache without its registries) import Numba.
"""

from __future__ import annotations

import sys

import numpy as np

# numba re-exports get_thread_id without listing it (an error only under --strict's re-export rule)
from numba import get_thread_id, njit, prange  # type: ignore[attr-defined, unused-ignore]

from dk.pol.exact import _math
from dk.pol.exact._cpu_backend import CpuBackend
from dk.pol.exact._numba_load import load_cached_without_registries

BLOCK = _math.BLOCK
ZERO = _math.ZERO
ONE = _math.ONE

_mul = njit(inline="always", cache=True)(_math.mul)
_f = _math.retarget(lambda fn: njit(cache=True)(fn), _mul)
exp32 = _f["exp32"]
log32 = _f["log32"]
erf32 = _f["erf32"]
sqrt32 = _f["sqrt32"]
_gelu = _f["gelu32"]
_gelu_grad = _f["gelu_grad32"]
_sgd = _f["sgd32"]
_adam = _f["adam32"]


@njit(parallel=True, cache=True, nogil=True)
def matmul(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:  # pragma: no cover - jitted
    """``c[i, j] = sum_k a[i, k] * b[k, j]`` in the blocked order (SPEC II §3).

    ``a`` may be any strided view (e.g. ``w.T``); ``b`` and ``c`` are C-contiguous. Each element
    is ``((+0 + t_0) + t_1) + ...`` over blocks of ``BLOCK`` consecutive ``k``, each block partial
    ``t_q`` the sequential float32 sum of its products from +0. For speed, four rows of ``c``
    share each pass over a pair of rows of ``b``, and the pair of products is folded in that same
    sequential order, so every element sees exactly the specified operations.
    """
    m, kk = a.shape
    n = b.shape[1]
    for ib in prange((m + 3) // 4):
        i = ib * 4
        i1 = min(i + 1, m - 1)
        i2 = min(i + 2, m - 1)
        i3 = min(i + 3, m - 1)
        t = np.empty((4, n), np.float32)
        acc = np.zeros((4, n), np.float32)
        t0 = t[0]
        t1 = t[1]
        t2 = t[2]
        t3 = t[3]
        for k0 in range(0, kk, BLOCK):
            kend = min(k0 + BLOCK, kk)
            t[:] = ZERO
            k = k0
            while k + 2 <= kend:
                a0 = a[i, k]
                a1 = a[i, k + 1]
                e0 = a[i1, k]
                e1 = a[i1, k + 1]
                f0 = a[i2, k]
                f1 = a[i2, k + 1]
                g0 = a[i3, k]
                g1 = a[i3, k + 1]
                b0 = b[k]
                b1 = b[k + 1]
                for j in range(n):
                    x0 = b0[j]
                    x1 = b1[j]
                    t0[j] = (t0[j] + a0 * x0) + a1 * x1
                    t1[j] = (t1[j] + e0 * x0) + e1 * x1
                    t2[j] = (t2[j] + f0 * x0) + f1 * x1
                    t3[j] = (t3[j] + g0 * x0) + g1 * x1
                k += 2
            if k < kend:
                b0 = b[k]
                for r in range(4):
                    ar = a[min(i + r, m - 1), k]
                    tr = t[r]
                    for j in range(n):
                        tr[j] = tr[j] + ar * b0[j]
            for r in range(4):
                for j in range(n):
                    acc[r, j] = acc[r, j] + t[r, j]
        for r in range(4):
            if i + r < m:
                for j in range(n):
                    c[i + r, j] = acc[r, j]


@njit(cache=True, nogil=True)
def add_bias_rows(c: np.ndarray, bias: np.ndarray) -> None:  # pragma: no cover - jitted
    """``c[i, j] += bias[i]`` (the bias is added after the dot product)."""
    for i in range(c.shape[0]):
        bi = bias[i]
        for j in range(c.shape[1]):
            c[i, j] = c[i, j] + bi


@njit(cache=True, nogil=True)
def sum_blocked(v: np.ndarray) -> np.float32:  # pragma: no cover - jitted
    """Blocked sum of a 1-D float32 array (SPEC II §3)."""
    total = ZERO
    n = v.shape[0]
    for k0 in range(0, n, BLOCK):
        t = ZERO
        for k in range(k0, min(k0 + BLOCK, n)):
            t = t + v[k]
        total = total + t
    return total


@njit(cache=True, nogil=True)
def rowsum(a: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - jitted
    """``out[i] = sum_j a[i, j]`` in the blocked order."""
    for i in range(a.shape[0]):
        out[i] = sum_blocked(a[i])


@njit(cache=True, nogil=True)
def relu_fwd(z: np.ndarray, h: np.ndarray) -> None:  # pragma: no cover - jitted
    """``h = z if z > 0 else +0`` elementwise on 1-D arrays."""
    for i in range(z.shape[0]):
        h[i] = z[i] if z[i] > ZERO else ZERO


@njit(cache=True, nogil=True)
def relu_bwd(z: np.ndarray, dh: np.ndarray, dz: np.ndarray) -> None:  # pragma: no cover
    """``dz = dh if z > 0 else +0`` elementwise on 1-D arrays."""
    for i in range(z.shape[0]):
        dz[i] = dh[i] if z[i] > ZERO else ZERO


@njit(cache=True, nogil=True)
def gelu_fwd(z: np.ndarray, h: np.ndarray) -> None:  # pragma: no cover - jitted
    """Exact-erf GELU elementwise on 1-D arrays."""
    for i in range(z.shape[0]):
        h[i] = _gelu(z[i])


@njit(cache=True, nogil=True)
def gelu_bwd(z: np.ndarray, dh: np.ndarray, dz: np.ndarray) -> None:  # pragma: no cover
    """``dz = dh * gelu'(z)`` elementwise on 1-D arrays."""
    for i in range(z.shape[0]):
        dz[i] = _mul(dh[i], _gelu_grad(z[i]))


@njit(cache=True, nogil=True)
def softmax_ce(zt, y, dzt, losses) -> None:  # type: ignore[no-untyped-def]  # pragma: no cover
    """Per-sample softmax cross-entropy on logits ``zt`` (classes, batch) (SPEC II §4.3).

    Writes ``losses[b] = (max + log(sum exp(z - max))) - z[y_b]`` and
    ``dzt[c, b] = (exp(z_c - max) / sum - [c == y_b]) / batch``.
    """
    nc, nb = zt.shape
    fb = np.float32(nb)
    for b in range(nb):
        mx = zt[0, b]
        for c in range(1, nc):
            if zt[c, b] > mx:
                mx = zt[c, b]
        total = ZERO
        for c0 in range(0, nc, BLOCK):
            t = ZERO
            for c in range(c0, min(c0 + BLOCK, nc)):
                e = exp32(zt[c, b] - mx)
                dzt[c, b] = e
                t = t + e
            total = total + t
        losses[b] = (mx + log32(total)) - zt[y[b], b]
        for c in range(nc):
            p = dzt[c, b] / total
            if c == y[b]:
                p = p - ONE
            dzt[c, b] = p / fb


@njit(cache=True, nogil=True)
def mse(zt, target, dzt, losses) -> None:  # type: ignore[no-untyped-def]  # pragma: no cover
    """Per-sample squared error on ``zt`` (outputs, batch) against ``target`` (batch, outputs).

    Writes ``losses[b] = sum_c (z - t)**2`` (blocked) and ``dzt = (2 (z - t)) / (batch * outputs)``.
    """
    nc, nb = zt.shape
    fn = np.float32(nb * nc)
    two = np.float32(2.0)
    for b in range(nb):
        total = ZERO
        for c0 in range(0, nc, BLOCK):
            t = ZERO
            for c in range(c0, min(c0 + BLOCK, nc)):
                d = zt[c, b] - target[b, c]
                t = t + _mul(d, d)
                dzt[c, b] = _mul(two, d) / fn
            total = total + t
        losses[b] = total


@njit(parallel=True, cache=True, nogil=True)
def im2col(x, col, colt) -> None:  # type: ignore[no-untyped-def]  # pragma: no cover
    """3x3, stride 1, padding 1 patches of ``x`` (C, B, H, W), zeros outside the image.

    ``col[(c*3 + ky)*3 + kx, (b*H + y)*W + xx] = x[c, b, y + ky - 1, xx + kx - 1]``;
    ``colt`` is its transpose.
    """
    nc, nb, hh, ww = x.shape
    for c in prange(nc):
        for ky in range(3):
            for kx in range(3):
                r = (c * 3 + ky) * 3 + kx
                for b in range(nb):
                    for y in range(hh):
                        sy = y + ky - 1
                        for xx in range(ww):
                            sx = xx + kx - 1
                            v = ZERO
                            if 0 <= sy < hh and 0 <= sx < ww:
                                v = x[c, b, sy, sx]
                            q = (b * hh + y) * ww + xx
                            col[r, q] = v
                            colt[q, r] = v


@njit(parallel=True, cache=True, nogil=True)
def col2im(dcol, dx) -> None:  # type: ignore[no-untyped-def]  # pragma: no cover
    """Adjoint of :func:`im2col`: each ``dx`` element sums its 9 patch entries in (ky, kx) order."""
    nc, nb, hh, ww = dx.shape
    for c in prange(nc):
        for b in range(nb):
            for y in range(hh):
                for xx in range(ww):
                    acc = ZERO
                    for ky in range(3):
                        oy = y - ky + 1
                        for kx in range(3):
                            ox = xx - kx + 1
                            if 0 <= oy < hh and 0 <= ox < ww:
                                acc = acc + dcol[(c * 3 + ky) * 3 + kx, (b * hh + oy) * ww + ox]
                    dx[c, b, y, xx] = acc


@njit(cache=True, nogil=True)
def maxpool_fwd(x, out, idx) -> None:  # type: ignore[no-untyped-def]  # pragma: no cover
    """2x2 stride-2 max pool of ``x`` (C, B, H, W); ``idx`` keeps the first maximum (0..3)."""
    nc, nb, ho, wo = out.shape
    for c in range(nc):
        for b in range(nb):
            for y in range(ho):
                for xx in range(wo):
                    best = x[c, b, 2 * y, 2 * xx]
                    arg = 0
                    for q in range(1, 4):
                        v = x[c, b, 2 * y + q // 2, 2 * xx + q % 2]
                        if v > best:
                            best = v
                            arg = q
                    out[c, b, y, xx] = best
                    idx[c, b, y, xx] = arg


@njit(cache=True, nogil=True)
def maxpool_bwd(dout, idx, dx) -> None:  # type: ignore[no-untyped-def]  # pragma: no cover
    """Route each pooled gradient to its recorded maximum; every other entry is +0."""
    nc, nb, ho, wo = dout.shape
    for c in range(nc):
        for b in range(nb):
            for y in range(ho):
                for xx in range(wo):
                    for q in range(4):
                        v = dout[c, b, y, xx] if q == idx[c, b, y, xx] else ZERO
                        dx[c, b, 2 * y + q // 2, 2 * xx + q % 2] = v


@njit(cache=True, nogil=True)
def sgd_update(p, g, buf, lr, momentum, wd, flags) -> None:  # type: ignore[no-untyped-def]  # pragma: no cover
    """SGD on flat float32 arrays in place (SPEC II §5.1); ``flags`` as in ``_math.sgd32``."""
    for i in range(p.shape[0]):
        p[i], buf[i] = _sgd(p[i], g[i], buf[i], lr, momentum, wd, flags)


@njit(cache=True, nogil=True)
def adam_update(p, g, m, v, hyper, flags) -> None:  # type: ignore[no-untyped-def]  # pragma: no cover
    """Adam on flat float32 arrays in place (SPEC II §5.2); ``hyper`` as in ``_math.adam32``."""
    for i in range(p.shape[0]):
        p[i], m[i], v[i] = _adam(p[i], g[i], m[i], v[i], hyper, flags)


@njit(parallel=True, cache=True, nogil=True)
def thread_ids(out: np.ndarray) -> None:  # pragma: no cover - jitted
    """``out[i]``: the id of the worker thread that ran iteration ``i`` of a parallel loop
    (kernels split work the same way; used to show that the parallel path ran)."""
    for i in prange(out.shape[0]):
        out[i] = get_thread_id()


#: Kernels that load from Numba's cache without its registries (see ``_numba_load``).
LIGHT_CACHE_LOADS = load_cached_without_registries([*globals().values(), *_f.values()])


def backend() -> CpuBackend:
    """The exact-mode operations run by the JIT kernels above (any thread count)."""
    return CpuBackend(sys.modules[__name__], compiled="jit")
