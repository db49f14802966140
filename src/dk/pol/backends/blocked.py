"""Blocked float64 convolutions: sums of at most ``BLOCK`` terms, added accurately (SPEC VI §1).

An element of a convolution output is a float64 sum of ``K`` exact products. Summed in one go
(any order) its error is bounded by ``γ_K·S``, and a weight gradient's ``K`` is the batch times
the image (8,192 terms for 32 images of 16×16): a bound that reaches the cap of SPEC VI §2 on
every element that cancels, so its log entry is kept on a quarter of them, each one a rounding
a worker could steer. Blocked, the terms are split into blocks of whole units of at most
``BLOCK`` products where a unit is that small (input channels of the kernel window for a
``convolution``; images for the weight and bias gradients of ``convolution_backward``), each
block is summed by any float64 kernel and the block sums are added by compensated summation
(:class:`Compensated`: error at most ``(2u + O(m²·u²))·Σ|block sums|``):

    |v − Σ x_i| ≤ γ_B·S + 2u·(1 + γ_B)·S + (bias) ≤ γ_(B+4)·S

for blocks of ``B`` terms (``u = 2^-53``), so SPEC VI §1 puts ``K' = B + 8`` in ``γ`` (§2) for
an output summed in more than one block (:func:`block_terms`). The input gradient of
``convolution_backward`` is not blocked: a sum over output channels and the window (144 to
4,608 terms in common nets) whose blocking by channels cost three times its time here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
import torch

#: SPEC VI §1: the most products in one block of a blocked sum.
BLOCK = 64
#: SPEC VI §1: ``K' = (terms per block) + SLACK``: the block sums' addition (``2u``), a bias and
#: a rounding of the result, with room to spare.
SLACK = 8

Conv = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]


@numba.njit(cache=True, nogil=True)
def neumaier_add(p, s, c):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    """Add the rows ``p[j]`` in order to the running compensated sums ``(s, c)`` (flat):
    Kahan–Babuška–Neumaier, each step IEEE-754 float64 operations in this order (no fast-math),
    the same as :meth:`Compensated.add` off the CPU."""
    for j in range(p.shape[0]):
        for i in range(p.shape[1]):
            x = p[j, i]
            t = s[i] + x
            if abs(s[i]) >= abs(x):
                c[i] += (s[i] - t) + x
            else:
                c[i] += (x - t) + s[i]
            s[i] = t


def finish(s: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``s + c`` of compensated sums; ``s`` itself where it is not finite (an infinite part
    makes the compensation ``inf − inf``)."""
    out: np.ndarray = np.where(np.isfinite(s), s + c, s)
    return out


class Compensated:
    """A running compensated sum of float64 tensors of one shape (SPEC VI §1, blocked sums):
    within ``(2u + O(m²·u²))·Σ|parts|`` of the exact sum of the ``m`` parts added, ``u = 2^-53``
    (Neumaier, parts in the order added). Holds two tensors the size of one part."""

    def __init__(self) -> None:
        self.s: torch.Tensor | None = None
        self.c: torch.Tensor | None = None

    def add(self, x: torch.Tensor) -> None:
        """Add one part."""
        if self.s is None or self.c is None:
            self.s = x.detach().clone(memory_format=torch.contiguous_format)
            self.c = torch.zeros_like(self.s)
        elif x.device.type == "cpu":
            xs = x.detach().contiguous().numpy().reshape(1, -1)
            neumaier_add(xs, self.s.numpy().reshape(-1), self.c.numpy().reshape(-1))
        else:
            self.add_vectorised(x)

    def add_vectorised(self, x: torch.Tensor) -> None:
        """:meth:`add` on any device: :func:`neumaier_add`'s operations as tensor operations
        (the same bits; tests compare them on the CPU)."""
        if self.s is None or self.c is None:
            self.add(x)
            return
        s, c = self.s, self.c
        t = s + x
        c += torch.where(s.abs() >= x.abs(), (s - t) + x, (x - t) + s)
        self.s = t

    def result(self) -> torch.Tensor:
        """The sum of the parts added."""
        if self.s is None or self.c is None:
            raise ValueError("a sum of no parts")
        return torch.where(torch.isfinite(self.s), self.s + self.c, self.s)


def sum_parts(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``Σ parts`` (float64 tensors of one shape), elementwise, by :class:`Compensated`.

    >>> a = torch.tensor([1e16], dtype=torch.float64)
    >>> float(sum_parts([a, torch.ones(1, dtype=torch.float64), -a]))
    1.0
    """
    acc = Compensated()
    for p in parts:
        acc.add(p)
    return acc.result()


def _prod(xs: Sequence[int]) -> int:
    return math.prod(int(x) for x in xs)


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    return [(i, min(n, i + size)) for i in range(0, n, size)]


def _per_block(window: int) -> int:
    """Whole units (channels or images) of ``window`` terms each per block: at least one."""
    return max(1, BLOCK // max(1, window))


def block_terms(name: str, args: Sequence[Any], k: Sequence[int | None]) -> list[int | None]:
    """``K'`` of each output of a convolution call (SPEC VI §1): ``γ``'s term count.

    ``k`` holds the outputs' ``K`` (``bounds._term_counts``); an output summed in one block
    keeps it. Other operations: ``k`` unchanged.
    """
    a = list(args)
    if name == "convolution":
        x, w, groups = a[0], a[1], int(a[8])
        units = int(x.shape[1]) // groups  # input channels per group (transposed or not)
        window = _prod(w.shape[2:])
        return [_blocked(k[0], units, window)]
    if name == "convolution_backward":  # the grad input is not blocked (below)
        go, x = a[0], a[1]
        sp = max(_prod(go.shape[2:]), _prod(x.shape[2:]))
        n = int(go.shape[0])
        return [k[0], _blocked(k[1], n, sp), _blocked(k[2], n, sp, per=_prod(go.shape[2:]))]
    return list(k)


def _blocked(k: int | None, units: int, window: int, per: int | None = None) -> int | None:
    """``K'`` of a sum over ``units`` units of ``window`` terms (``per`` of them in this output:
    the bias gradient's), blocked by whole units (SPEC VI §1)."""
    if k is None:
        return None
    ub = _per_block(window)
    if units <= ub:
        return k  # one block: the plain sum
    return ub * (window if per is None else per) + SLACK


def _group_index(groups: int, per_group: int, lo: int, hi: int, device: Any) -> torch.Tensor:
    """Channel indices ``g·per_group + c`` for every group ``g`` and ``lo <= c < hi``."""
    g = torch.arange(groups, device=device).unsqueeze(1) * per_group
    return (g + torch.arange(lo, hi, device=device).unsqueeze(0)).reshape(-1)


def convolution(args: Sequence[Any], conv: Conv, func: Any, fast: bool = False) -> torch.Tensor:
    """``aten.convolution`` on float64 ``args``, blocked by input channels (SPEC VI §1).

    ``conv(func, args, kwargs)`` computes one float64 convolution (any kernel); ``fast``:
    the blocks of a 2-D convolution from one im2col (``kernels64``) where it applies.
    """
    a = list(args)
    x, w, bias, transposed, groups = a[0], a[1], a[2], bool(a[6]), int(a[8])
    units = int(x.shape[1]) // groups
    ub = _per_block(_prod(w.shape[2:]))
    if units <= ub:
        one: torch.Tensor = conv(func, tuple(a), {})
        return one
    from dk.pol.backends import kernels64

    summed = kernels64.convolution_blocked(tuple(a), ub) if fast else None
    if summed is not None:
        return _with_bias(summed, bias)
    acc = Compensated()
    for lo, hi in _chunks(units, ub):
        idx = _group_index(groups, units, lo, hi, x.device)
        xs = x.index_select(1, idx) if groups > 1 else x[:, lo:hi]
        # weight: (out, in/g, ...) or, transposed, (in, out/g, ...)
        ws = w.index_select(0, idx) if transposed else w[:, lo:hi]
        acc.add(conv(func, (xs, ws, None, *a[3:]), {}))
    return _with_bias(acc.result(), bias)


def _with_bias(out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is None:
        return out
    return out + bias.reshape([1, -1] + [1] * (out.dim() - 2))


def convolution_backward(
    args: Sequence[Any], conv: Conv, func: Any, fast: bool = False
) -> tuple[Any, Any, Any]:
    """``aten.convolution_backward`` on float64 ``args`` (SPEC VI §1): the weight and bias
    gradients blocked by images (``fast``: through ``kernels64`` where it applies), the input
    gradient in one call (a sum over output channels and the kernel window: 144 to 4,608 terms
    in common nets, and blocking it by channels cost three times its time here)."""
    a = list(args)
    go, x, w = a[0], a[1], a[2]
    mask = list(a[10])
    rest = a[3:10]
    gi = gw = gb = None
    if mask[0]:
        gi = conv(func, (go, x, w, *rest, [True, False, False]), {})[0]
    if mask[1] or mask[2]:
        n = int(go.shape[0])
        sp = max(_prod(go.shape[2:]), _prod(x.shape[2:]))
        nb = _per_block(sp)
        wmask = [False, bool(mask[1]), bool(mask[2])]
        from dk.pol.backends import kernels64

        fast_wb = kernels64.weight_grad_blocks((go, x, w, *rest, wmask), nb) if fast else None
        if fast_wb is not None:
            gw, gb = fast_wb
        elif n <= nb:
            _, gw, gb = conv(func, (go, x, w, *rest, wmask), {})
        else:
            acc_w, acc_b = Compensated(), Compensated()
            for lo, hi in _chunks(n, nb):
                _, pw, pb = conv(func, (go[lo:hi], x[lo:hi], w, *rest, wmask), {})
                if mask[1]:
                    acc_w.add(pw)
                if mask[2]:
                    acc_b.add(pb)
            gw = acc_w.result() if mask[1] else None
            gb = acc_b.result() if mask[2] else None
    return gi, gw, gb


_BLOCKED = {"convolution": convolution, "convolution_backward": convolution_backward}


def applies(func: Any, kwargs: Any) -> bool:
    """Whether the ATen call ``func(*args, **kwargs)`` is summed in blocks (SPEC VI §1): the
    ``default`` overloads of ``convolution`` and ``convolution_backward`` (others write an
    ``out=``), with every argument positional (as the dispatcher passes them). The rounded
    mode blocks exactly these calls and ``bounds.site_bounds`` gives exactly them ``K'``."""
    return (
        not kwargs and func._overloadname == "default" and func.overloadpacket.__name__ in _BLOCKED
    )


def run(func: Any, args: Sequence[Any], conv: Conv, fast: bool = False) -> Any:
    """``func(*args)`` (float64, positional) blocked as SPEC VI §1 says, each block through
    ``conv(func, args, kwargs)`` (``fast``: ``kernels64``'s blocked kernels where they apply)."""
    return _BLOCKED[func.overloadpacket.__name__](args, conv, func, fast)
