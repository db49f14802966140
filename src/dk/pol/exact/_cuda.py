"""Numba CUDA kernels of exact mode: one thread per output element (SPEC II §3-§6).

Each thread performs, for its element, the same float32 operation sequence as the CPU kernel
in ``_cpu``, so the two give identical bits. Three compiler facts make that hold on a GPU:

* NVVM contracts ``a * b + c`` into an FMA by default, and ``fastmath=False`` does not turn that
  off (Numba passes only ``opt`` and its fast-math flags to NVVM, and NVVM's ``-fma`` defaults to
  1). Every product is therefore written ``mul(a, b)``, bound here to ``libdevice.fmul_rn``
  (PTX ``mul.rn.f32``), which the CUDA math API documents as never merged into a multiply-add.
* With ``fastmath=False`` Numba compiles with ``-prec-div=1 -prec-sqrt=1 -ftz=0``: ``/`` and
  ``sqrt`` are correctly rounded and subnormals are kept, as on the CPU.
* ``exp``, ``log`` and ``erf`` come from ``_math`` (fixed arithmetic), never from libdevice.

Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) kernels run as Python over NumPy float32
scalars, whose products are rounded on their own; ``mul`` is then a plain multiply.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import config
from numba import cuda as _numba_cuda

from dk.errors import BackendUnavailable
from dk.pol.exact import _math

# numba.cuda's annotations cover the host API only (``cuda.grid`` is a kernel intrinsic typed as
# a host callable; ``cuda.jit`` is untyped), so kernel code sees the module as ``Any``.
cuda: Any = _numba_cuda
BLOCK = _math.BLOCK
ZERO = _math.ZERO
ONE = _math.ONE
TWO = _math.TWO
SIM = bool(config.ENABLE_CUDASIM)  # type: ignore[attr-defined]  # set from the environment
THREADS = 32 if SIM else 128

if SIM:
    mul = _math.mul
else:  # pragma: no cover - needs a GPU
    from numba.cuda import libdevice

    @cuda.jit(device=True, inline=True)  # type: ignore[untyped-decorator]  # numba: untyped
    def mul(a: Any, b: Any) -> Any:
        """Unfused float32 product (``mul.rn.f32``)."""
        return libdevice.fmul_rn(a, b)  # type: ignore[no-untyped-call]  # numba: untyped


_f = _math.retarget(lambda fn: cuda.jit(device=True)(fn), mul)
exp32 = _f["exp32"]
log32 = _f["log32"]
gelu32 = _f["gelu32"]
gelu_grad32 = _f["gelu_grad32"]
sgd32 = _f["sgd32"]
adam32 = _f["adam32"]


@cuda.jit
def matmul_k(a, b, c, trans_a):  # type: ignore[no-untyped-def]
    """One element of ``c = op(a) @ b`` in the blocked order."""
    idx = cuda.grid(1)
    m, n = c.shape
    if idx < m * n:
        i = idx // n
        j = idx % n
        kk = b.shape[0]
        acc = ZERO
        for k0 in range(0, kk, BLOCK):
            t = ZERO
            for k in range(k0, min(k0 + BLOCK, kk)):
                av = a[k, i] if trans_a else a[i, k]
                t = t + mul(av, b[k, j])
            acc = acc + t
        c[i, j] = acc


@cuda.jit
def add_bias_rows_k(c, bias):  # type: ignore[no-untyped-def]
    """``c[i, j] += bias[i]``."""
    idx = cuda.grid(1)
    m, n = c.shape
    if idx < m * n:
        c[idx // n, idx % n] = c[idx // n, idx % n] + bias[idx // n]


@cuda.jit
def rowsum_k(a, out):  # type: ignore[no-untyped-def]
    """``out[i]`` = blocked sum of row ``i``; also used for the loss total (one row)."""
    i = cuda.grid(1)
    if i < a.shape[0]:
        n = a.shape[1]
        acc = ZERO
        for k0 in range(0, n, BLOCK):
            t = ZERO
            for k in range(k0, min(k0 + BLOCK, n)):
                t = t + a[i, k]
            acc = acc + t
        out[i] = acc


@cuda.jit
def act_fwd_k(z, h, gelu):  # type: ignore[no-untyped-def]
    """ReLU or GELU on flat arrays."""
    i = cuda.grid(1)
    if i < z.shape[0]:
        if gelu:
            h[i] = gelu32(z[i])
        else:
            h[i] = z[i] if z[i] > ZERO else ZERO


@cuda.jit
def act_bwd_k(z, dh, dz, gelu):  # type: ignore[no-untyped-def]
    """ReLU or GELU backward on flat arrays."""
    i = cuda.grid(1)
    if i < z.shape[0]:
        if gelu:
            dz[i] = mul(dh[i], gelu_grad32(z[i]))
        else:
            dz[i] = dh[i] if z[i] > ZERO else ZERO


@cuda.jit
def softmax_ce_k(zt, y, dzt, losses):  # type: ignore[no-untyped-def]
    """Softmax cross-entropy of one sample (a column of ``zt``)."""
    b = cuda.grid(1)
    nc, nb = zt.shape
    if b < nb:
        fb = np.float32(nb)
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


@cuda.jit
def mse_k(zt, target, dzt, losses):  # type: ignore[no-untyped-def]
    """Squared error of one sample and its gradient."""
    b = cuda.grid(1)
    nc, nb = zt.shape
    if b < nb:
        fn = np.float32(nb * nc)
        total = ZERO
        for c0 in range(0, nc, BLOCK):
            t = ZERO
            for c in range(c0, min(c0 + BLOCK, nc)):
                d = zt[c, b] - target[b, c]
                t = t + mul(d, d)
                dzt[c, b] = mul(TWO, d) / fn
            total = total + t
        losses[b] = total


@cuda.jit
def im2col_k(x, col, colt):  # type: ignore[no-untyped-def]
    """One entry of the 3x3 / pad 1 patch matrix and its transpose."""
    idx = cuda.grid(1)
    nc, nb, hh, ww = x.shape
    n = nb * hh * ww
    if idx < nc * 9 * n:
        r = idx // n
        q = idx % n
        c = r // 9
        ky = (r // 3) % 3
        kx = r % 3
        b = q // (hh * ww)
        y = (q // ww) % hh
        xx = q % ww
        sy = y + ky - 1
        sx = xx + kx - 1
        v = ZERO
        if 0 <= sy < hh and 0 <= sx < ww:
            v = x[c, b, sy, sx]
        col[r, q] = v
        colt[q, r] = v


@cuda.jit
def col2im_k(dcol, dx):  # type: ignore[no-untyped-def]
    """One input-gradient element: its 9 patch entries summed in (ky, kx) order."""
    idx = cuda.grid(1)
    nc, nb, hh, ww = dx.shape
    if idx < nc * nb * hh * ww:
        c = idx // (nb * hh * ww)
        b = (idx // (hh * ww)) % nb
        y = (idx // ww) % hh
        xx = idx % ww
        acc = ZERO
        for ky in range(3):
            oy = y - ky + 1
            for kx in range(3):
                ox = xx - kx + 1
                if 0 <= oy < hh and 0 <= ox < ww:
                    acc = acc + dcol[(c * 3 + ky) * 3 + kx, (b * hh + oy) * ww + ox]
        dx[c, b, y, xx] = acc


@cuda.jit
def maxpool_fwd_k(x, out, idxs):  # type: ignore[no-untyped-def]
    """One 2x2 window: first maximum and its index."""
    idx = cuda.grid(1)
    nc, nb, ho, wo = out.shape
    if idx < nc * nb * ho * wo:
        c = idx // (nb * ho * wo)
        b = (idx // (ho * wo)) % nb
        y = (idx // wo) % ho
        xx = idx % wo
        best = x[c, b, 2 * y, 2 * xx]
        arg = 0
        for q in range(1, 4):
            v = x[c, b, 2 * y + q // 2, 2 * xx + q % 2]
            if v > best:
                best = v
                arg = q
        out[c, b, y, xx] = best
        idxs[c, b, y, xx] = arg


@cuda.jit
def maxpool_bwd_k(dout, idxs, dx):  # type: ignore[no-untyped-def]
    """One 2x2 window of the input gradient."""
    idx = cuda.grid(1)
    nc, nb, ho, wo = dout.shape
    if idx < nc * nb * ho * wo:
        c = idx // (nb * ho * wo)
        b = (idx // (ho * wo)) % nb
        y = (idx // wo) % ho
        xx = idx % wo
        for q in range(4):
            v = dout[c, b, y, xx] if q == idxs[c, b, y, xx] else ZERO
            dx[c, b, 2 * y + q // 2, 2 * xx + q % 2] = v


@cuda.jit
def permute_k(src, dst, shape, strides):  # type: ignore[no-untyped-def]
    """``dst.flat[i] = src.flat[offset]`` for a 4-D index of ``dst`` and permuted strides."""
    i = cuda.grid(1)
    if i < dst.shape[0]:
        r = i
        off = 0
        for d in range(3, -1, -1):
            off += (r % shape[d]) * strides[d]
            r //= shape[d]
        dst[i] = src[off]


@cuda.jit
def sgd_k(p, g, buf, lr, momentum, wd, flags):  # type: ignore[no-untyped-def]
    """SGD on one element."""
    i = cuda.grid(1)
    if i < p.shape[0]:
        p[i], buf[i] = sgd32(p[i], g[i], buf[i], lr, momentum, wd, flags)


@cuda.jit
def adam_k(p, g, m, v, hyper, flags):  # type: ignore[no-untyped-def]
    """Adam on one element."""
    i = cuda.grid(1)
    if i < p.shape[0]:
        p[i], m[i], v[i] = adam32(p[i], g[i], m[i], v[i], hyper, flags)


def _launch(kernel: Any, n: int, *args: Any) -> None:
    if n > 0:
        kernel[(n + THREADS - 1) // THREADS, THREADS](*args)


class CudaBackend:
    """The exact-mode operations on CUDA device arrays (or the simulator's)."""

    name = "cuda"

    def __init__(self) -> None:
        if not (SIM or cuda.is_available()):
            raise BackendUnavailable(
                "exact mode on cuda needs a CUDA GPU (or NUMBA_ENABLE_CUDASIM=1)"
            )

    def asarray(self, a: np.ndarray) -> Any:
        """Copy a host array to the device."""
        return cuda.to_device(np.ascontiguousarray(a))

    def empty(self, shape: tuple[int, ...], dtype: type = np.float32) -> Any:
        """An uninitialised device buffer."""
        return cuda.device_array(shape, dtype=dtype)

    def to_host(self, a: Any, out: np.ndarray) -> None:
        """Copy a device array into a host array."""
        a.copy_to_host(out)

    def matmul(self, a: Any, b: Any, c: Any, trans_a: bool = False) -> None:
        """``c = op(a) @ b`` in the blocked order."""
        _launch(matmul_k, c.size, a, b, c, trans_a)

    def add_bias_rows(self, c: Any, bias: Any) -> None:
        """``c[i, :] += bias[i]``."""
        _launch(add_bias_rows_k, c.size, c, bias)

    def rowsum(self, a: Any, out: Any) -> None:
        """Blocked row sums."""
        _launch(rowsum_k, a.shape[0], a, out)

    def loss_total(self, losses: Any) -> np.float32:
        """Blocked sum of the per-sample losses."""
        out = cuda.device_array(1, dtype=np.float32)
        _launch(rowsum_k, 1, losses.reshape(1, losses.shape[0]), out)
        return np.float32(out.copy_to_host()[0])

    def act_fwd(self, kind: str, z: Any, h: Any) -> None:
        """Activation forward."""
        _launch(act_fwd_k, z.size, z.reshape(z.size), h.reshape(h.size), kind == "gelu")

    def act_bwd(self, kind: str, z: Any, dh: Any, dz: Any) -> None:
        """Activation backward."""
        flat = (z.reshape(z.size), dh.reshape(dh.size), dz.reshape(dz.size))
        _launch(act_bwd_k, z.size, *flat, kind == "gelu")

    def softmax_ce(self, zt: Any, y: Any, dzt: Any, losses: Any) -> None:
        """Per-sample softmax cross-entropy."""
        _launch(softmax_ce_k, zt.shape[1], zt, y, dzt, losses)

    def mse(self, zt: Any, target: Any, dzt: Any, losses: Any) -> None:
        """Per-sample squared error."""
        _launch(mse_k, zt.shape[1], zt, target, dzt, losses)

    def im2col(self, x: Any, col: Any, colt: Any) -> None:
        """3x3 / pad 1 patches."""
        _launch(im2col_k, col.size, x, col, colt)

    def col2im(self, dcol: Any, dx: Any) -> None:
        """Adjoint of im2col."""
        _launch(col2im_k, dx.size, dcol, dx)

    def maxpool_fwd(self, x: Any, out: Any, idx: Any) -> None:
        """2x2 max pool."""
        _launch(maxpool_fwd_k, out.size, x, out, idx)

    def maxpool_bwd(self, dout: Any, idx: Any, dx: Any) -> None:
        """2x2 max pool backward."""
        _launch(maxpool_bwd_k, dout.size, dout, idx, dx)

    def permute(self, src: Any, dst: Any, axes: tuple[int, ...]) -> None:
        """``dst = src.transpose(axes)`` for C-contiguous arrays of up to 4 dimensions."""
        elem = [math.prod(src.shape[d + 1 :]) for d in range(len(src.shape))]
        pad = 4 - len(axes)
        shape = (1,) * pad + tuple(int(src.shape[a]) for a in axes)
        strides = (0,) * pad + tuple(int(elem[a]) for a in axes)
        _launch(permute_k, dst.size, src.reshape(src.size), dst.reshape(dst.size), shape, strides)

    def sgd(self, p, g, buf, lr, momentum, wd, flags) -> None:  # type: ignore[no-untyped-def]
        """SGD update of one parameter."""
        flat = (p.reshape(p.size), g.reshape(g.size), buf.reshape(buf.size))
        _launch(sgd_k, p.size, *flat, lr, momentum, wd, flags)

    def adam(self, p, g, m, v, hyper, flags) -> None:  # type: ignore[no-untyped-def]
        """Adam update of one parameter."""
        flat = (p.reshape(p.size), g.reshape(g.size), m.reshape(m.size), v.reshape(v.size))
        _launch(adam_k, p.size, *flat, hyper, flags)
