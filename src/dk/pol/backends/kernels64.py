"""Faster float64 CPU kernels for the bounded sites of the rounded backend (SPEC VI §1, §2).

A bounded site's thresholds come from an a-priori bound ``γ_K·S`` that holds for every
summation order, so its float64 value may come from any correct float64 kernel; the verifier
need not use the same one. PyTorch's CPU build computes float64 matrix products with MKL
and float64 convolutions with a generic im2col loop. On an AMD EPYC (AVX2) NumPy's OpenBLAS
was 1.5-3x faster than MKL on the same products; on an Intel Xeon (AVX-512) MKL was 1.0-1.4x
faster than OpenBLAS (``PRODUCTS`` picks one per machine). Here:

* ``mm``, ``addmm``, ``bmm``, ``baddbmm``: NumPy ``matmul`` on float64 views of the tensors
  (``β·C`` and ``α`` applied after the product: at most two more roundings, which ``K``
  counts), unless ``PRODUCTS`` is ``"aten"`` (:func:`aten_products`);
* ``convolution`` (2-D, ``groups = 1``, not transposed, any stride, padding, dilation):
  im2col by chunks of images that fit in cache, then one batched ``matmul`` per chunk (a
  convolution summed in one block, SPEC VI §1), or one per chunk and block of channels with
  the blocks added by compensated summation (:func:`convolution_blocked`);
* the weight and bias gradients of ``convolution_backward`` (same cases), from the same
  columns, in blocks of images (:func:`weight_grad_blocks`); the input gradient stays with
  ATen, which is faster at it than an im2col transpose (col2im) in NumPy;
* taken before the float64 copies are made, straight from float32 tensors: ``sum`` over
  leading or trailing dimensions, with its ``S`` in the same pass (:func:`sum32`), and, for
  unbounded sites, Euclidean norms (:func:`norms32`: gradient clipping).

Every element is the same sum of exact float64 products (padding adds exact zeros) in another
order (within each block), so ``K`` (``K'``) of SPEC VI §2 bounds it. Anything else (float32
or other dtypes, other devices,
transposed or grouped convolutions, channels-last layouts, outputs that are not bounded
sites) returns ``None`` and the caller runs ATen. Results have ATen's shapes, dtypes and (for
the cases taken here) its contiguous strides.

``S`` (``bounds.py``) stays with ATen where it is computed whole: NumPy's float32 products on
absolute values were no faster here (0.7-1.2x of torch's on a transformer's shapes); a
matrix product's ``S`` is computed only where a norm bound does not clear the element.

NumPy's BLAS has its own thread pool: it is set to torch's intra-op thread count
(``torch.get_num_threads()``) before each call through ``threadpoolctl`` (every OpenBLAS loaded at
the first call: NumPy's, and SciPy's if loaded; MKL or Accelerate builds keep their own), so a
rounded run uses the threads its job was given and no more.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
import torch

from dk.pol.backends import ops as op_tables
from dk.pol.backends.bounds import K_MAX
from dk.pol.backends.normbounds import squares

# Number of calls each kernel answered (tests prove the fast path ran; diagnostics).
calls: Counter[str] = Counter()

_F64 = torch.float64
_CHUNK = 1 << 21  # bytes of im2col columns per chunk of images (fits in L2 + L3 slice)
# Smallest convolution (multiply-adds, N·Co·C·kh·kw·Ho·Wo) taken here: below, ATen is as fast
# (measured on one AVX2 core); tests set these to 0.
MIN_MACS = {"convolution": 1 << 21}


class _Threads:
    """NumPy's OpenBLAS thread count, kept equal to torch's intra-op thread count."""

    def __init__(self) -> None:
        self.controllers: list[Any] | None = None
        self.n = -1

    def sync(self) -> None:
        n = torch.get_num_threads()
        if n == self.n:
            return
        if self.controllers is None:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:  # no control: OpenBLAS keeps its own default
                self.controllers = []
            else:
                ctl = ThreadpoolController().select(internal_api="openblas")
                self.controllers = list(ctl.lib_controllers)
        for c in self.controllers:
            c.set_num_threads(n)
        self.n = n


threads = _Threads()


def _np(t: torch.Tensor) -> np.ndarray:
    return np.asarray(t.detach().numpy())


def _blasable(a: np.ndarray) -> np.ndarray:
    """``a`` if BLAS can read each of its matrices (last two dims) in place, else a C copy."""
    if a.ndim < 2:
        return a
    it = a.itemsize
    sr, sc = a.strides[-2], a.strides[-1]
    r, c = a.shape[-2], a.shape[-1]
    if (sc == it and sr >= it * max(c, 1) and sr % it == 0) or (
        sr == it and sc >= it * max(r, 1) and sc % it == 0
    ):
        return a
    return np.ascontiguousarray(a)


def _scalar(x: Any) -> float | None:
    """A real scalar argument (``alpha``, ``beta``) as float, None if it is not one."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x)


def _cpu(*ts: Any) -> bool:
    return all(
        isinstance(t, torch.Tensor) and t.dtype == _F64 and t.device.type == "cpu" for t in ts
    )


Empty = Callable[[tuple[int, ...]], torch.Tensor]


def _product(name: str, args: Any, kwargs: Any) -> tuple[Any, Any, Any, float, float] | None:
    """``(a, b, c, β, α)`` of a bounded float64 CPU matrix product, or None (not one)."""
    if name in ("mm", "bmm"):
        if len(args) != 2 or kwargs:
            return None
        a, b = args
        c, beta, alpha = None, 0.0, 1.0
    elif name in ("addmm", "baddbmm"):
        if len(args) != 3 or set(kwargs) - {"beta", "alpha"}:
            return None
        c, a, b = args
        beta_, alpha_ = _scalar(kwargs.get("beta", 1)), _scalar(kwargs.get("alpha", 1))
        if beta_ is None or alpha_ is None or alpha_ == 0.0 or not _cpu(c):
            return None
        beta, alpha = beta_, alpha_
    else:
        return None
    nd = 2 if name in ("mm", "addmm") else 3
    if not _cpu(a, b) or a.dim() != nd or b.dim() != nd:
        return None
    k = int(a.shape[-1])
    if int(b.shape[-2]) != k or (nd == 3 and int(a.shape[0]) != int(b.shape[0])):
        return None
    if k == 0 or k + 2 > K_MAX or a.numel() == 0 or b.numel() == 0:
        return None  # not a bounded site (or empty): ATen's kernel
    return a, b, c, beta, alpha


def _shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    return (*a.shape[:-1], int(b.shape[-1]))


def matmul(name: str, args: Any, kwargs: Any, empty: Empty | None = None) -> Any:
    """``mm``/``bmm``/``addmm``/``baddbmm`` of float64 CPU tensors through NumPy, or None.
    ``empty``: where the product goes (a contiguous float64 tensor of a shape), else new."""
    got = _product(name, args, kwargs)
    if got is None:
        return None
    a, b, c, beta, alpha = got
    threads.sync()
    if empty is None:
        out = np.matmul(_blasable(_np(a)), _blasable(_np(b)))
    else:
        out = np.matmul(_blasable(_np(a)), _blasable(_np(b)), out=_np(empty(_shape(a, b))))
    if alpha != 1.0:
        out *= alpha
    if c is not None and beta != 0.0:  # β = 0: C is ignored (NaN in C is not propagated)
        cn = _np(c)
        if beta != 1.0:
            cn = cn * beta
        out += cn  # broadcasts as ATen does (C is a bias row or the full result)
    calls[name] += 1
    return torch.from_numpy(out)


def _out_size(n: int, k: int, s: int, p: int, d: int) -> int:
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _conv_args(x: Any, w: Any, stride: Any, padding: Any, dilation: Any) -> bool:
    """Whether the 2-D convolution ``x * w`` (``groups = 1``, not transposed) is taken here."""
    if not _cpu(x, w) or x.dim() != 4 or w.dim() != 4 or int(x.shape[1]) != int(w.shape[1]):
        return False
    if any(len(v) != 2 for v in (stride, padding, dilation)):
        return False
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        return False
    for t in (x, w):  # ATen keeps a channels-last layout; these kernels write NCHW
        if not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
            return False
    ho = _out_size(int(x.shape[2]), int(w.shape[2]), stride[0], padding[0], dilation[0])
    wo = _out_size(int(x.shape[3]), int(w.shape[3]), stride[1], padding[1], dilation[1])
    return ho > 0 and wo > 0 and x.numel() > 0 and w.numel() > 0


class _Cols:
    """im2col of a padded NCHW input, by chunks of images: ``(b, C·kh·kw, Ho·Wo)`` each."""

    def __init__(
        self, x: np.ndarray, kh: int, kw: int, stride: Any, padding: Any, dilation: Any
    ) -> None:
        n, c, h, w = x.shape
        (self.sh, self.sw), (ph, pw), (self.dh, self.dw) = stride, padding, dilation
        self.kh, self.kw = kh, kw
        self.ho = _out_size(h, kh, self.sh, ph, self.dh)
        self.wo = _out_size(w, kw, self.sw, pw, self.dw)
        self.x, self.pad, self.n = x, (ph, pw), n
        self.ck = c * kh * kw
        per = 8 * self.ck * self.ho * self.wo
        self.nb = max(1, min(n, _CHUNK // max(per, 1)))
        self._xp: np.ndarray | None = None
        self._buf: np.ndarray | None = None

    def chunks(self) -> range:
        return range(0, self.n, self.nb)

    def window(self, i: int, j: int) -> tuple[slice, slice]:
        """The padded input's rows and columns under kernel tap ``(i, j)``."""
        r0, c0 = i * self.dh, j * self.dw
        return (
            slice(r0, r0 + self.sh * (self.ho - 1) + 1, self.sh),
            slice(c0, c0 + self.sw * (self.wo - 1) + 1, self.sw),
        )

    def get(self, n0: int) -> np.ndarray:
        """The columns of images ``n0 …`` (one chunk): ``(b, C·kh·kw, Ho·Wo)``."""
        if self._xp is None or self._buf is None:  # padded once, on first use
            x, (ph, pw) = self.x, self.pad
            if ph or pw:
                n, c, h, w = x.shape
                xp = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
                xp[:, :, ph : ph + h, pw : pw + w] = x
                x = xp
            self._xp = x
            self._buf = np.empty((self.nb, x.shape[1], self.kh, self.kw, self.ho, self.wo))
        b = min(self.nb, self.n - n0)
        buf = self._buf[:b]
        for i in range(self.kh):
            for j in range(self.kw):
                rows, cols = self.window(i, j)
                buf[:, :, i, j] = self._xp[n0 : n0 + b, :, rows, cols]
        return buf.reshape(b, self.ck, self.ho * self.wo)


def convolution(args: Any, kwargs: Any) -> Any:
    """ATen ``convolution`` of float64 CPU tensors (2-D, groups 1, not transposed), or None."""
    if kwargs or len(args) != 9:
        return None
    x, w, bias, stride, padding, dilation, transposed, _, groups = args
    if transposed or groups != 1 or not _conv_args(x, w, stride, padding, dilation):
        return None
    if bias is not None and not _cpu(bias):
        return None
    co, c, kh, kw = (int(s) for s in w.shape)
    if c * kh * kw + 1 > K_MAX:
        return None
    cols = _Cols(_np(x), kh, kw, stride, padding, dilation)
    n = int(x.shape[0])
    if n * co * cols.ck * cols.ho * cols.wo < MIN_MACS["convolution"]:
        return None
    threads.sync()
    w2 = _blasable(_np(w).reshape(co, cols.ck))
    out = np.empty((n, co, cols.ho * cols.wo))
    for n0 in cols.chunks():
        col = cols.get(n0)
        np.matmul(w2, col, out=out[n0 : n0 + col.shape[0]])
    if bias is not None:
        out += _np(bias)[:, None]
    calls["convolution"] += 1
    return torch.from_numpy(out.reshape(n, co, cols.ho, cols.wo))


_FOREACH_NORM = torch.ops.aten._foreach_norm.Scalar
_VECTOR_NORM = torch.ops.aten.linalg_vector_norm.default
_SUM_DIMS = torch.ops.aten.sum.dim_IntList


def _norm32(t: Any) -> torch.Tensor | None:
    """The float64 Euclidean norm of a contiguous float32 CPU tensor, as a 0-d tensor."""
    if not (isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device.type == "cpu"):
        return None
    if not t.is_contiguous():
        return None
    sq = float(squares(_np(t.view(1, -1)), -1)[0]) if t.numel() else 0.0
    return torch.tensor(math.sqrt(sq), dtype=_F64)


def norms32(func: Any, args: Any, kwargs: Any) -> Any:
    """``_foreach_norm`` or ``linalg_vector_norm`` (Euclidean, whole tensors, no ``dtype``) of
    contiguous float32 CPU tensors, computed in float64 from the float32 values without float64
    copies of them, as the covered call would return it on those copies; or None.

    These outputs are unbounded sites (SPEC VI §2): like ATen's float64 reduction, whose
    order follows the CPU's vector width, this sums the squares in an order of its own; two
    orders of ``K`` non-negative float64 terms differ by at most ``(K - 1)·2^-53`` of the sum,
    in practice ``√K`` times less (the honest-reproduction assumption of §2)."""
    if func is not _FOREACH_NORM and func is not _VECTOR_NORM:
        return None
    b = op_tables.bind(func, args, kwargs)
    if b.get("dtype") is not None or _scalar(b.get("ord", 2)) != 2.0:
        return None
    out: Any = None
    if func is _FOREACH_NORM:
        ts = b["self"]
        norms = [_norm32(t) for t in ts] if isinstance(ts, list | tuple) else [None]
        out = None if any(o is None for o in norms) else norms
    elif b.get("dim") is None and not b.get("keepdim"):
        out = _norm32(b["self"])
    if out is not None:
        calls[func.overloadpacket.__name__] += 1
    return out


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _row_sums(x, out, s):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    """``out[r] = Σ_c x[r, c]``, ``s[r] = Σ_c |x[r, c]|`` in float64 of a C-contiguous float32
    ``(R, C)`` array (reassociated: one vectorised loop per row)."""
    for r in range(x.shape[0]):
        acc = 0.0
        mag = 0.0
        for c in range(x.shape[1]):
            t = np.float64(x[r, c])
            acc += t
            mag += abs(t)
        out[r] = acc
        s[r] = mag


@numba.njit(cache=True, nogil=True)
def _col_sums(x, out, s):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    """``out[c] = Σ_r x[r, c]``, ``s[c] = Σ_r |x[r, c]|`` in float64 of a C-contiguous float32
    ``(R, C)`` array (rows added in order, each a vectorised loop over the columns)."""
    out[:] = 0.0
    s[:] = 0.0
    for r in range(x.shape[0]):
        for c in range(x.shape[1]):
            t = np.float64(x[r, c])
            out[c] += t
            s[c] += abs(t)


def sum32(func: Any, args: Any, kwargs: Any) -> tuple[torch.Tensor, np.ndarray] | None:
    """``sum.dim_IntList`` of a contiguous float32 CPU tensor over its leading or its trailing
    dimensions (no ``dtype``), in float64 straight from the float32 values: ``(the float64
    result, S)``, ``S`` the sums of absolute values (SPEC VI §1: in any order, in float64 here)
    flat in C order; or None (the caller casts and runs ATen).

    A bounded site: any summation order replays it, so one pass computes both the sum and
    its ``S``, with neither a float64 copy of the input nor a second pass on absolute values."""
    if func is not _SUM_DIMS:
        return None
    b = op_tables.bind(func, args, kwargs)
    x, dims, keep = b["self"], b["dim"], bool(b["keepdim"])
    if b["dtype"] is not None or not isinstance(x, torch.Tensor):
        return None
    if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous():
        return None
    n = x.dim()
    dims = list(range(n)) if not dims else list(dims)  # none given: every dimension
    if n == 0 or x.numel() == 0 or not all(isinstance(d, int) and -n <= d < n for d in dims):
        return None  # (out of range: ATen's error)
    red = sorted({d % n for d in dims})
    if len(red) != len(dims) or red[-1] - red[0] != len(red) - 1:
        return None  # repeated (ATen's error), or not one run of dimensions
    shape = tuple(int(d) for d in x.shape)
    kept = [d for i, d in enumerate(shape) if i not in red]
    size = math.prod(shape[i] for i in red)
    if size > K_MAX:
        return None  # not a bounded site
    view = _np(x).reshape(-1)
    out_n = x.numel() // size
    out, mag = np.empty(out_n), np.empty(out_n)
    if red[-1] == n - 1:  # trailing dimensions: a sum per row
        _row_sums(view.reshape(out_n, size), out, mag)
    elif red[0] == 0:  # leading dimensions: a sum per column
        _col_sums(view.reshape(size, out_n), out, mag)
    else:
        return None
    oshape = [1 if i in red else d for i, d in enumerate(shape)] if keep else kept
    calls["sum"] += 1
    return torch.from_numpy(out).view(oshape), mag


def _cpu_vendor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's vendor string (``GenuineIntel``, ``AuthenticAMD``, ...) from ``cpuinfo``'s
    ``vendor_id`` line (Linux on x86), else ``GenuineIntel`` if ``platform.processor()`` names
    it (Windows), else ``""``."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    import platform

    return "GenuineIntel" if "GenuineIntel" in platform.processor() else ""


def aten_products(vendor: str | None = None, mkl: bool | None = None) -> bool:
    """True where the float64 matrix products of bounded sites are left to ATen: torch's BLAS
    is MKL and the CPU is Intel's. Measured on one thread, LM shapes (``bench_rounded.py
    --site``): on an Intel Xeon with AVX-512 MKL's float64 products were 1.0-1.4x faster than
    NumPy's OpenBLAS (width-256 and -512 LM intervals: medians about 5 % less CPU over
    alternating pairs, single runs -9 % to +5 %, the same log); on an AMD EPYC with AVX2 MKL
    was 1.5-3x slower. Everywhere else NumPy's. Either is a correct kernel (SPEC VI §1): the
    choice is this machine's speed, never the result's validity."""
    vendor = _cpu_vendor() if vendor is None else vendor
    mkl = bool(torch._C.has_mkl) if mkl is None else mkl
    return mkl and vendor == "GenuineIntel"


# Who computes the float64 matrix products of bounded sites on this machine: "numpy" (``matmul``)
# or "aten" (the caller's ATen kernel). Tests set it.
PRODUCTS = "aten" if aten_products() else "numpy"


def run32(func: Any, args: Any, kwargs: Any) -> tuple[Any, list[np.ndarray] | None] | None:
    """The covered call ``func(*args, **kwargs)`` on its float32 CPU tensors, computed in
    float64 without float64 copies of them: ``(float64 result, S of each output or None)``,
    ``S`` given where the kernel computes it with a bounded site's result (:func:`sum32`),
    None for unbounded sites (:func:`norms32`); or None (the caller copies and runs ATen)."""
    if func is _SUM_DIMS:
        got = sum32(func, args, kwargs)
        return None if got is None else (got[0], [got[1]])
    if func is _FOREACH_NORM or func is _VECTOR_NORM:
        out = norms32(func, args, kwargs)
        return None if out is None else (out, None)
    return None


def aten_product(func: Any, args: Any, kwargs: Any, empty: Empty) -> Any:
    """A bounded float64 CPU ``mm``/``bmm``/``addmm``/``baddbmm`` by ATen's ``out=`` overload
    into ``empty(shape)`` (the same kernel as the call itself), or None (not one)."""
    name = func.overloadpacket.__name__
    got = _product(name, args, kwargs) if func._overloadname == "default" else None
    if got is None:
        return None
    a, b = got[:2]
    return func.overloadpacket.out(*args, **kwargs, out=empty(_shape(a, b)))


def run(func: Any, args: Any, kwargs: Any, empty: Empty | None = None) -> Any:
    """The covered call ``func(*args, **kwargs)`` on float64 CPU tensors through a faster
    kernel, or None (the caller runs ATen): only ``.default`` overloads of bounded ops.
    ``empty``: where a matrix product goes (``Pool.empty``), else a new array."""
    if func._overloadname != "default":
        return None
    name = func.overloadpacket.__name__
    if name in ("mm", "addmm", "bmm", "baddbmm"):
        if PRODUCTS == "numpy":
            return matmul(name, args, kwargs, empty)
        return None if empty is None else aten_product(func, args, kwargs, empty)
    if name == "convolution":
        return convolution(args, kwargs)
    return None


def _block_sums(parts: np.ndarray, images: int) -> np.ndarray:
    """``(b, …)`` per-image parts -> ``(⌈b/images⌉, flat)`` sums of blocks of whole images."""
    b = parts.shape[0]
    flat = parts.reshape(b, -1)
    if images == 1:
        return np.ascontiguousarray(flat)
    return np.stack([flat[i : i + images].sum(axis=0) for i in range(0, b, images)])


def convolution_blocked(args: Any, units: int) -> torch.Tensor | None:
    """A 2-D ``convolution`` (cases as :func:`convolution`) without its bias, summed in blocks
    of ``units`` input channels (SPEC VI §1): one im2col, one product per block, the blocks
    added by compensated summation as they come (memory: the output twice and one block's
    product); or None."""
    if len(args) != 9:
        return None
    x, w, _, stride, padding, dilation, transposed, _, groups = args
    if transposed or groups != 1 or not _conv_args(x, w, stride, padding, dilation):
        return None
    from dk.pol.backends.blocked import finish, neumaier_add  # blocked imports this module

    co, c, kh, kw = (int(s) for s in w.shape)
    cols = _Cols(_np(x), kh, kw, stride, padding, dilation)
    n, per, hw = int(x.shape[0]), kh * kw, cols.ho * cols.wo
    threads.sync()
    w2 = _np(w).reshape(co, cols.ck)
    blocks = [(c0 * per, min(c, c0 + units) * per) for c0 in range(0, c, units)]
    s, comp = np.zeros((n, co * hw)), np.zeros((n, co * hw))
    part = np.empty((cols.nb, co, hw))
    for n0 in cols.chunks():
        col = cols.get(n0)
        b = col.shape[0]
        sv, cv = s[n0 : n0 + b].reshape(-1), comp[n0 : n0 + b].reshape(-1)
        for r0, r1 in blocks:
            np.matmul(_blasable(w2[:, r0:r1]), col[:, r0:r1], out=part[:b])
            neumaier_add(part[:b].reshape(1, -1), sv, cv)
    calls["convolution_blocked"] += 1
    return torch.from_numpy(finish(s, comp).reshape(n, co, cols.ho, cols.wo))


def weight_grad_blocks(args: Any, images: int) -> tuple[Any, Any] | None:
    """The weight and bias gradients of a 2-D ``convolution_backward`` (``groups = 1``, not
    transposed; the outputs its mask asks for, else None), each summed in blocks of at most
    ``images`` images and the block sums added by compensated summation (SPEC VI §1): one
    product per chunk of images (``_Cols``; a chunk may end a block early, which only makes
    that block smaller); or None when this case is not taken here."""
    if len(args) != 11:
        return None
    go, x, w, _, stride, padding, dilation, transposed, _, groups, mask = args
    if transposed or groups != 1 or not _conv_args(x, w, stride, padding, dilation):
        return None
    if not _cpu(go) or go.dim() != 4:
        return None
    if not go.is_contiguous() and go.is_contiguous(memory_format=torch.channels_last):
        return None
    co, c, kh, kw = (int(s) for s in w.shape)
    n = int(x.shape[0])
    hw_o = int(go.shape[2]) * int(go.shape[3])
    cols = _Cols(_np(x), kh, kw, stride, padding, dilation)
    if (cols.ho, cols.wo) != tuple(go.shape[2:]) or int(go.shape[1]) != co:
        return None
    from dk.pol.backends.blocked import finish, neumaier_add  # blocked imports this module

    threads.sync()
    g3 = _np(go).reshape(n, co, hw_o)
    sw, cw = np.zeros(co * cols.ck), np.zeros(co * cols.ck)
    sb, cb = np.zeros(co), np.zeros(co)
    for n0 in cols.chunks():
        b = min(cols.nb, n - n0)
        g = g3[n0 : n0 + b]
        if mask[1]:
            part = np.matmul(_blasable(g), cols.get(n0).transpose(0, 2, 1))  # (b, Co, C·k)
            neumaier_add(_block_sums(part, images), sw, cw)
        if mask[2]:
            neumaier_add(_block_sums(g.sum(axis=2), images), sb, cb)
    gw = torch.from_numpy(finish(sw, cw).reshape(co, c, kh, kw)) if mask[1] else None
    gb = torch.from_numpy(finish(sb, cb)) if mask[2] else None
    calls["weight_grad_blocks"] += 1
    return gw, gb
