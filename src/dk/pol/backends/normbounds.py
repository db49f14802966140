"""Bounds of ``S`` from norms: bounded sites without a second pass on absolute values
(SPEC VI §1, §2).

A bounded site's thresholds need ``S = Σ|term|`` of each element, and the plain way to get it
(``bounds.AbsOp``) is the site's operation run again on the absolute values of its inputs: a
second matrix product or convolution. But only the elements that the scan of SPEC VI §2 flags
need ``S``, and thresholds grow with ``S``. So for the CPU's matrix products and 2-D
convolutions the scan runs on an upper bound of ``S`` from Euclidean norms (Cauchy–Schwarz:
``Σ|a_k|·|b_k| ≤ ‖a‖·‖b‖``, over the terms of each element, computed in float64 and inflated
by ``1 + K·2^-20`` for its own roundings), which costs about as much as reading the inputs
once; the few elements it flags (1.5–2× as many as ``S`` would) get ``S`` itself, in float64,
from their own terms (``s_at``). Every element that ``S`` would flag is among them, so the log
is the one ``S`` gives. Where more than 1/256 of a site is flagged (sums that cancel:
thresholds at the cap), ``S`` of the whole site is computed the plain way, once, and the site
is scanned again with it.

float32 inputs squared and summed in float64 neither overflow nor underflow, and a float64
sum of ``K ≤ 2^16`` non-negative terms is within ``K·2^-53`` of exact: the inflation covers
both the bound's roundings and those of ``S`` computed in float64.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import numba
import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.grad import conv2d_input

from dk.pol.backends._scan import Outer
from dk.pol.backends._switch import Switch
from dk.pol.backends.bounds import AbsOp, Bound

_F64 = torch.float64
_LOW = (torch.float32, torch.bfloat16)
_INFLATE = 2.0**-20  # (1 + K·2^-20): the bound's float64 roundings and S's own
# Smallest operation (multiply-adds) bounded from norms: below, the pass on absolute values
# costs less than the norms' fixed costs (measured: ResNet width 8, 2.4 M multiply-adds per
# convolution, 10 % slower from norms; an LM's 8 M-term products even). Tests set it to 0.
MIN_MACS = 1 << 22


class _NormBound(Bound, ABC):
    """A bound whose :meth:`s_upper` comes from norms (:meth:`_upper`) and whose :meth:`s_at`
    sums the flagged elements' own terms (:meth:`_exact`), or takes the whole ``S`` past
    ``1/_REFINE_FRACTION`` of the site. Each operation's subclass gives the two."""

    refine = True
    # past 1/256 of a site, the whole S (one BLAS pass) is cheaper than gathering each
    # flagged element's terms (measured: break-even near 1/500 on a 1024×512×1024 product)
    _REFINE_FRACTION = 256
    _CHUNK_TERMS = 1 << 21  # float64 terms gathered at once by _exact

    def __init__(
        self, k: int, shared: AbsOp, index: int, k_sum: int, shape: tuple[int, ...]
    ) -> None:
        super().__init__(k, shared, index, k_sum)
        self._shape = shape
        self._ub: np.ndarray | None = None

    @abstractmethod
    def _upper(self) -> np.ndarray:
        """An upper bound of ``S``, broadcastable to the output's shape (float64)."""

    @abstractmethod
    def _exact(self, idx: np.ndarray) -> np.ndarray:
        """``S`` of the elements ``idx`` (flat), summed in float64 from their own terms."""

    def _outer(self) -> Outer | None:
        """:meth:`_upper` as factors (:class:`_scan.Outer`) where it has that form, else None."""
        return None

    def scan_upper(self) -> np.ndarray | Outer:
        if self._s is not None or self._ub is not None:
            return self.s_upper()
        outer = self._outer()  # the scan multiplies rows by columns itself
        return self.s_upper() if outer is None else outer

    def s_upper(self) -> np.ndarray:
        if self._s is not None:
            return self._s
        if self._ub is None:
            ub = np.broadcast_to(self._upper(), self._shape)
            self._ub = np.ascontiguousarray(ub, dtype=np.float64).reshape(-1)
        return self._ub

    def whole(self, flagged: int) -> bool:
        """Whether ``flagged`` elements are better served by the whole ``S``."""
        return flagged * self._REFINE_FRACTION > math.prod(self._shape)

    def s_at(self, idx: np.ndarray) -> np.ndarray:
        if self._s is None and self.whole(idx.size):
            self.s()  # much of the site: S of all of it, as any bounded site
        if self._s is not None:
            at: np.ndarray = self._s[idx]
            return at
        return self._exact(idx)

    def _inflate(self) -> float:
        return 1.0 + self.k * _INFLATE


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _product_s_at(a, b, bb, ii, jj, order, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    """``out[e] = Σ_k |a[bb_e, ii_e, k]|·|b[bb_e, k, jj_e]|`` for each element ``e``, taken in
    ``order``; ``a`` is ``(B, m, K)``, ``b`` ``(B, K, n)``, float32 (or float64), any strides;
    the terms are exact products in float64.

    The row of ``a`` and the column of ``b`` are copied (as absolute values) into contiguous
    buffers only when they change from one element to the next, so an order that keeps one of
    them fixed reads its strided operand once per row (column). The sum may be reassociated
    (``fastmath``: one vectorised loop): any order of ``K`` non-negative float64 terms is
    within ``K·2^-53`` of exact, which the bound's inflation covers (module docstring)."""
    k_len = a.shape[2]
    row = np.empty(k_len)
    col = np.empty(k_len)
    ra, ri, cb, cj = -1, -1, -1, -1
    for t in range(order.size):
        e = order[t]
        q, i, j = bb[e], ii[e], jj[e]
        if q != ra or i != ri:
            for k in range(k_len):
                row[k] = abs(a[q, i, k])
            ra, ri = q, i
        if q != cb or j != cj:
            for k in range(k_len):
                col[k] = abs(b[q, k, j])
            cb, cj = q, j
        s = 0.0
        for k in range(k_len):
            s += row[k] * col[k]
        out[e] = s


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _rows_sq(x, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    """``out[r] = Σ_c x[r, c]²`` in float64 of a C-contiguous ``(R, C)`` array (reassociated:
    one vectorised loop, within ``C·2^-53`` of exact)."""
    for r in range(x.shape[0]):
        s = 0.0
        for c in range(x.shape[1]):
            t = np.float64(x[r, c])
            s += t * t
        out[r] = s


@numba.njit(cache=True, nogil=True)
def _cols_sq(x, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    """``out[b, c] += Σ_r x[b, r, c]²`` in float64 of a C-contiguous ``(B, R, C)`` array (rows
    added in order, each a vectorised loop over the columns)."""
    for b in range(x.shape[0]):
        for r in range(x.shape[1]):
            for c in range(x.shape[2]):
                t = np.float64(x[b, r, c])
                out[b, c] += t * t


def squares(x: np.ndarray, over: int) -> np.ndarray:
    """``Σ x²`` in float64 over axis ``over`` (-1 or -2) of a float32 ``(…, R, C)`` array: shape
    ``(…, R)`` or ``(…, C)``. One pass reading float32 (half of a float64 copy's bytes); a
    transposed matrix is read in its own memory order, anything else not C-contiguous is
    copied first."""
    if x.strides[-1] != x.itemsize and x.strides[-2] == x.itemsize:
        x, over = x.swapaxes(-1, -2), -3 - over  # its memory order: the other axis
    shape = x.shape[:-1] if over == -1 else (*x.shape[:-2], x.shape[-1])
    x3 = np.ascontiguousarray(x).reshape(-1, x.shape[-2], x.shape[-1])
    if over == -1:
        out = np.empty(x3.shape[0] * x3.shape[1])
        _rows_sq(x3.reshape(-1, x3.shape[2]), out)
    else:
        out = np.zeros((x3.shape[0], x3.shape[2]))
        _cols_sq(x3, out)
    return out.reshape(shape)


def _abs64(a: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.abs(a, dtype=np.float64)
    return out


def _norms(a: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """Euclidean norms of float32 ``a`` over ``dims``, in float64."""
    return a.detach().to(_F64).square().sum(dims).sqrt()


class _ProductBound(_NormBound):
    """``mm``, ``bmm``, ``addmm``, ``baddbmm``: ``S_ij = |β|·|C_ij| + |α|·Σ_k |A_ik|·|B_kj| ≤
    |β|·|C_ij| + |α|·‖A_i‖·‖B_j‖`` from the rows' and columns' norms (``O(m·K + K·n + m·n)``
    instead of a second ``O(m·n·K)`` product; on a transformer's products the bound is
    1.5–2× ``S`` at the median)."""

    def __init__(
        self,
        k: int,
        shared: AbsOp,
        k_sum: int,
        operands: tuple[np.ndarray, np.ndarray, np.ndarray | None],
        scalars: tuple[float, float],
    ) -> None:
        a, b, _ = operands
        super().__init__(k, shared, 0, k_sum, (*a.shape[:-1], b.shape[-1]))
        self._a, self._b, self._c = operands  # (…, m, K), (…, K, n), C or None (float32)
        self._alpha, self._beta = abs(scalars[0]), abs(scalars[1])

    def _c_term(self) -> np.ndarray | None:
        if self._c is None or self._beta == 0.0:
            return None
        return self._beta * (1.0 + _INFLATE) * _abs64(self._c)

    def _factors(self) -> Outer:
        """``‖A_i‖·‖B_j‖`` (scaled) as rows and columns, and the ``C`` term, over the output
        as ``(B, m, n)`` (``B = 1`` for ``mm``/``addmm``); only where ``α ≠ 0``."""
        rows, cols = np.sqrt(squares(self._a, -1)), np.sqrt(squares(self._b, -2))
        rows *= self._alpha * self._inflate()
        m, n = self._shape[-2], self._shape[-1]
        return Outer(rows.reshape(-1, m), cols.reshape(-1, n), self._c_term())

    def _outer(self) -> Outer | None:
        return None if self._alpha == 0.0 else self._factors()

    def _upper(self) -> np.ndarray:
        if self._alpha != 0.0:
            return self._factors().full().reshape(self._shape)
        ub: np.ndarray = np.zeros(1)  # α = 0: ATen ignores A and B (even inf or NaN), so does S
        c = self._c_term()
        return ub if c is None else ub + c

    def _exact(self, idx: np.ndarray) -> np.ndarray:
        m, n = self._shape[-2], self._shape[-1]
        out = np.zeros(idx.size, dtype=np.float64)
        if self._alpha != 0.0 and idx.size:
            a = self._a.reshape(-1, m, self._a.shape[-1])
            b = self._b.reshape(-1, self._b.shape[-2], n)
            bb, i, j = idx // (m * n), (idx // n) % m, idx % n
            # idx is in (b, i, j) order: a's row is read once per row; where only b is
            # strided along K, take the elements by column so that b's is read once instead
            by_col = a.strides[-1] == a.itemsize and b.strides[-2] != b.itemsize
            order = np.lexsort((i, j, bb)) if by_col else np.arange(idx.size)
            _product_s_at(a, b, bb, i, j, order, out)
            out *= self._alpha
        if self._c is not None and self._beta != 0.0:
            c = np.broadcast_to(self._c, self._shape).reshape(-1, m, n)
            out += self._beta * _abs64(c[idx // (m * n), idx // n % m, idx % n])
        return out


class _Geometry:
    """A 2-D convolution (not transposed): input (N, C, H, W), weight (Co, C/g, kh, kw),
    output (N, Co, Ho, Wo), with stride, padding, dilation and groups."""

    def __init__(self, x: torch.Tensor, w: torch.Tensor, conv: tuple[Any, ...]) -> None:
        stride, padding, dilation, groups = conv
        self.stride, self.padding = tuple(stride), tuple(padding)
        self.dilation, self.groups = tuple(dilation), int(groups)
        self.n, self.c, self.h, self.w = (int(d) for d in x.shape)
        self.co, self.cg, self.kh, self.kw = (int(d) for d in w.shape)
        self.og = self.co // self.groups
        (s0, s1), (p0, p1), (d0, d1) = self.stride, self.padding, self.dilation
        self.ho = (self.h + 2 * p0 - d0 * (self.kh - 1) - 1) // s0 + 1
        self.wo = (self.w + 2 * p1 - d1 * (self.kw - 1) - 1) // s1 + 1
        self._xp: np.ndarray | None = None

    def ones(self) -> torch.Tensor:
        return torch.ones(self.groups, 1, self.kh, self.kw, dtype=_F64)

    def padded_abs(self, x: torch.Tensor) -> np.ndarray:
        """``|x|`` (float32) zero-padded as the convolution pads it, once per call (a
        verifier asks for entries' and demanded elements' ``S`` separately)."""
        if self._xp is None:
            (p0, p1) = self.padding
            self._xp = np.pad(np.abs(x.detach().numpy()), ((0, 0), (0, 0), (p0, p0), (p1, p1)))
        return self._xp

    def by_group(self, per_channel: torch.Tensor) -> torch.Tensor:
        """(N, C, …) summed over the channels of each group: (N, g, …)."""
        n, rest = per_channel.shape[0], per_channel.shape[2:]
        return per_channel.reshape(n, self.groups, self.cg, *rest).sum(2)


class _ConvBound(_NormBound):
    """``convolution`` (output 0): ``S[n,o,h,w] = Σ_{c,i,j} |x|·|w[o,c,i,j]| (+ |b_o|) ≤
    ‖patch(n,h,w)‖·‖w[o]‖ (+ |b_o|)``; the patches' squared norms are one convolution of
    the channel sums of ``x²`` with a kernel of ones (per group)."""

    def __init__(
        self, k: int, shared: AbsOp, k_sum: int, geo: _Geometry, x: Any, w: Any, b: Any
    ) -> None:
        super().__init__(k, shared, 0, k_sum, (geo.n, geo.co, geo.ho, geo.wo))
        self._g, self._x, self._w, self._b = geo, x, w, b

    def _parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The patches' norms (N, g, Ho, Wo), the weights' (Co,) inflated, ``(1 + 2^-20)·|b|``."""
        g = self._g
        sq = g.by_group(self._x.detach().to(_F64).square())
        patch = F.conv2d(sq, g.ones(), None, g.stride, g.padding, g.dilation, g.groups).sqrt()
        wn = _norms(self._w, (1, 2, 3)) * self._inflate()
        bias = None if self._b is None else (1.0 + _INFLATE) * self._b.detach().to(_F64).abs()
        return patch, wn, bias

    def _upper(self) -> np.ndarray:
        g = self._g
        patch, wn, bias = self._parts()
        ub = patch.repeat_interleave(g.og, dim=1) * wn.view(1, g.co, 1, 1)  # (N, Co, Ho, Wo)
        if bias is not None:
            ub += bias.view(1, g.co, 1, 1)
        return np.asarray(ub.numpy())

    def _outer(self) -> Outer | None:
        """One group: element ``(n, o, h, w)`` is ``‖w[o]‖·‖patch(n, h, w)‖`` (+ bias), rows
        by columns over ``(N, Co, Ho·Wo)``, the same products as :meth:`_upper`'s."""
        g = self._g
        if g.groups != 1:
            return None
        patch, wn, bias = self._parts()
        rows = np.ascontiguousarray(np.broadcast_to(wn.numpy(), (g.n, g.co)))
        c = None if bias is None else bias.numpy().reshape(1, g.co, 1)
        return Outer(rows, patch.reshape(g.n, g.ho * g.wo).numpy(), c)

    def _exact(self, idx: np.ndarray) -> np.ndarray:
        g = self._g
        n, o, h, w = np.unravel_index(idx, self._shape)
        xp = g.padded_abs(self._x)
        wa = np.abs(self._w.detach().numpy())
        rows = h[:, None] * g.stride[0] + np.arange(g.kh)[None, :] * g.dilation[0]
        cols = w[:, None] * g.stride[1] + np.arange(g.kw)[None, :] * g.dilation[1]
        chans = (o // g.og)[:, None] * g.cg + np.arange(g.cg)[None, :]
        out = np.empty(idx.size, dtype=np.float64)
        step = max(1, self._CHUNK_TERMS // max(1, g.cg * g.kh * g.kw))
        for lo in range(0, idx.size, step):
            sl = slice(lo, lo + step)
            patch = xp[
                n[sl, None, None, None],
                chans[sl, :, None, None],
                rows[sl, None, :, None],
                cols[sl, None, None, :],
            ]
            out[sl] = np.einsum("cijk,cijk->c", _abs64(patch), _abs64(wa[o[sl]]))
        if self._b is not None:
            out += _abs64(self._b.detach().numpy())[o]
        return out


class _ConvInputBound(_NormBound):
    """``convolution_backward`` grad input (output 0): ``S[n,c,y,x] = Σ |go[n,o,h,w]|·|w[o,c,i,j]|``
    over the ``(o, i, j)`` whose window covers ``(y, x)``, ``≤ ‖those go‖·‖w[:, c]‖``; the
    first norms are the transposed convolution of the group sums of ``go²`` with ones."""

    def __init__(self, k: int, shared: AbsOp, k_sum: int, geo: _Geometry, go: Any, w: Any) -> None:
        super().__init__(k, shared, 0, k_sum, (geo.n, geo.c, geo.h, geo.w))
        self._g, self._go, self._w = geo, go, w

    def _parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The covering windows' norms (N, g, H, W) and the weights' per input channel (C,),
        inflated."""
        g = self._g
        sq = self._go.detach().to(_F64).square()
        sq = sq.reshape(g.n, g.groups, g.og, g.ho, g.wo).sum(2)  # (N, g, Ho, Wo)
        cover = conv2d_input(  # type: ignore[no-untyped-call]  # torch: untyped
            (g.n, g.groups, g.h, g.w), g.ones(), sq, g.stride, g.padding, g.dilation, g.groups
        )
        w2 = self._w.detach().to(_F64).square()
        wn = w2.reshape(g.groups, g.og, g.cg, g.kh, g.kw).sum((1, 3, 4)).sqrt().reshape(g.c)
        return cover.clamp_min(0.0).sqrt(), wn * self._inflate()

    def _upper(self) -> np.ndarray:
        g = self._g
        cover, wn = self._parts()
        cover = cover.repeat_interleave(g.cg, dim=1)  # (N, C, H, W)
        return np.asarray((cover * wn.view(1, g.c, 1, 1)).numpy())

    def _outer(self) -> Outer | None:
        """One group: ``‖w[:, c]‖·‖covering go(n, y, x)‖`` as rows by columns over
        ``(N, C, H·W)``, the same products as :meth:`_upper`'s."""
        g = self._g
        if g.groups != 1:
            return None
        cover, wn = self._parts()
        rows = np.ascontiguousarray(np.broadcast_to(wn.numpy(), (g.n, g.c)))
        return Outer(rows, cover.reshape(g.n, g.h * g.w).numpy(), None)

    def _exact(self, idx: np.ndarray) -> np.ndarray:
        g = self._g
        n, c, y, x = np.unravel_index(idx, self._shape)
        goa = np.abs(self._go.detach().numpy())
        wa = np.abs(self._w.detach().numpy())
        grp, cc = c // g.cg, c % g.cg
        outs = grp[:, None] * g.og + np.arange(g.og)[None, :]  # (n_c, Og)
        out = np.zeros(idx.size, dtype=np.float64)
        for i in range(g.kh):
            hh = y + g.padding[0] - i * g.dilation[0]
            ok_h = (hh >= 0) & (hh % g.stride[0] == 0) & (hh // g.stride[0] < g.ho)
            for j in range(g.kw):
                ww = x + g.padding[1] - j * g.dilation[1]
                ok = ok_h & (ww >= 0) & (ww % g.stride[1] == 0) & (ww // g.stride[1] < g.wo)
                if not ok.any():
                    continue
                sel = np.flatnonzero(ok)
                h, w = hh[sel] // g.stride[0], ww[sel] // g.stride[1]
                gsel = goa[n[sel, None], outs[sel], h[:, None], w[:, None]]  # (n_ok, Og)
                wsel = wa[outs[sel], cc[sel, None], i, j]  # (n_ok, Og)
                out[sel] += np.einsum("co,co->c", _abs64(gsel), _abs64(wsel))
        return out


class _ConvWeightBound(_NormBound):
    """``convolution_backward`` grad weight (output 1): ``S[o,c,i,j] = Σ_{n,h,w} |go[n,o,h,w]|
    ·|x[n, c, h·s + i·d − p, …]| ≤ ‖go[:, o]‖·‖x[:, c]‖`` (the whole channel covers every
    shifted window)."""

    def __init__(self, k: int, shared: AbsOp, k_sum: int, geo: _Geometry, go: Any, x: Any) -> None:
        super().__init__(k, shared, 1, k_sum, (geo.co, geo.cg, geo.kh, geo.kw))
        self._g, self._go, self._x = geo, go, x

    def _upper(self) -> np.ndarray:
        g = self._g
        gon = _norms(self._go, (0, 2, 3)) * self._inflate()  # (Co,)
        xn = _norms(self._x, (0, 2, 3)).reshape(g.groups, g.cg)  # (g, C/g)
        ub = gon.view(g.co, 1) * xn.repeat_interleave(g.og, dim=0)  # (Co, C/g)
        return np.asarray(ub.view(g.co, g.cg, 1, 1).numpy())

    def _exact(self, idx: np.ndarray) -> np.ndarray:
        g = self._g
        o, cc, i, j = np.unravel_index(idx, self._shape)
        xp = g.padded_abs(self._x)
        goa = np.abs(self._go.detach().numpy())
        c = (o // g.og) * g.cg + cc
        rows = i[:, None] * g.dilation[0] + np.arange(g.ho)[None, :] * g.stride[0]
        cols = j[:, None] * g.dilation[1] + np.arange(g.wo)[None, :] * g.stride[1]
        out = np.empty(idx.size, dtype=np.float64)
        step = max(1, self._CHUNK_TERMS // max(1, g.n * g.ho * g.wo))
        for lo in range(0, idx.size, step):
            sl = slice(lo, lo + step)
            win = xp[:, c[sl, None, None], rows[sl, :, None], cols[sl, None, :]]  # (N, n_c, Ho, Wo)
            out[sl] = np.einsum("nchw,nchw->c", _abs64(win), _abs64(goa[:, o[sl]]))
        return out


class _BiasBound(Bound):
    """``convolution_backward`` grad bias (output 2): ``S[o] = Σ_{n,h,w} |go[n,o,h,w]|``,
    itself (one pass over ``go``)."""

    def __init__(self, k: int, shared: AbsOp, k_sum: int, go: Any) -> None:
        super().__init__(k, shared, 2, k_sum)
        self._go = go

    def s(self) -> np.ndarray:
        if self._s is None:
            self._s = self._go.detach().to(_F64).abs().sum((0, 2, 3)).numpy()
        return self._s


_PRODUCTS = {"mm": (2, False), "bmm": (3, False), "addmm": (2, True), "baddbmm": (3, True)}


def _cpu32(*ts: Any) -> bool:
    return all(
        isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device.type == "cpu"
        for t in ts
    )


def _cpu_low(*ts: Any) -> bool:
    """Float32 or bfloat16 (autocast) CPU tensors: a product's operands, whose values the bound
    reads as float32 (exactly: every bfloat16 is a float32)."""
    return all(
        isinstance(t, torch.Tensor) and t.dtype in _LOW and t.device.type == "cpu" for t in ts
    )


def _f32(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    out: np.ndarray = (t if t.dtype == torch.float32 else t.float()).numpy()
    return out


def _product(name: str, args: Any, kwargs: Any, k: int, k_sum: int, shared: AbsOp) -> Bound | None:
    if set(kwargs) - {"alpha", "beta"}:
        return None
    nd, has_c = _PRODUCTS[name]
    a = list(args)
    if len(a) != (3 if has_c else 2):
        return None
    c, x, y = (a[0], a[1], a[2]) if has_c else (None, a[0], a[1])
    alpha, beta = kwargs.get("alpha", 1), kwargs.get("beta", 1)
    if not _cpu_low(*(t for t in (x, y, c) if t is not None)) or any(
        isinstance(z, bool) or not isinstance(z, int | float) for z in (alpha, beta)
    ):
        return None
    if x.dim() != nd or y.dim() != nd or x.numel() * int(y.shape[-1]) < MIN_MACS:
        return None
    if x.numel() == 0 or y.numel() == 0:  # no terms (tests set MIN_MACS to 0): the plain bound
        return None
    operands = (_f32(x), _f32(y), None if c is None else _f32(c))
    return _ProductBound(k, shared, k_sum, operands, (float(alpha), float(beta)))


def _conv2d(x: Any, w: Any, transposed: Any, conv: tuple[Any, ...]) -> _Geometry | None:
    """The geometry of a CPU float32 2-D convolution that is not transposed, else None."""
    stride, padding, dilation, groups = conv
    pairs = all(isinstance(v, list | tuple) and len(v) == 2 for v in (stride, padding, dilation))
    if not pairs or not isinstance(groups, int) or bool(transposed) or not _cpu32(x, w):
        return None
    if x.dim() != 4 or w.dim() != 4:
        return None
    geo = _Geometry(x, w, conv)
    return geo if geo.n * w.numel() * geo.ho * geo.wo >= MIN_MACS else None


def norm_bound(
    name: str, args: Any, kwargs: Any, index: int, k: int, k_sum: int, shared: AbsOp
) -> Bound | None:
    """The norm bound of output ``index`` of a bounded call (SPEC VI §1), or None (then the
    caller's plain :class:`Bound`): CPU float32 (or bfloat16, under autocast) ``mm``, ``bmm``,
    ``addmm``, ``baddbmm`` with real scalars, and CPU float32 2-D ``convolution`` /
    ``convolution_backward`` that are not transposed, with positional arguments."""
    if not _switch.on:
        return None
    if name in _PRODUCTS:
        return _product(name, args, kwargs, k, k_sum, shared)
    a = list(args)
    if name == "convolution" and not kwargs and len(a) == 9 and index == 0:
        x, w, b = a[0], a[1], a[2]
        geo = _conv2d(x, w, a[6], (a[3], a[4], a[5], a[8]))
        if geo is None or (b is not None and not _cpu32(b)):
            return None
        return _ConvBound(k, shared, k_sum, geo, x, w, b)
    if name == "convolution_backward" and not kwargs and len(a) == 11:
        go, x, w = a[0], a[1], a[2]
        geo = _conv2d(x, w, a[7], (a[4], a[5], a[6], a[9]))
        if geo is None or not _cpu32(go):
            return None
        if index == 0:
            return _ConvInputBound(k, shared, k_sum, geo, go, w)
        if index == 1:
            return _ConvWeightBound(k, shared, k_sum, geo, go, x)
        return _BiasBound(k, shared, k_sum, go)
    return None


_switch = Switch()
#: Within ``with off():`` every bounded site's ``S`` comes from the operation on absolute values
#: (``bounds.AbsOp``), as on a GPU: no norm bounds. The same logs (SPEC VI §1); for
#: measurements and tests. Process-wide.
off = _switch.off
