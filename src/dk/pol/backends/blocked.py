"""Blocked float64 convolutions: sums of at most ``BLOCK`` terms, added accurately (SPEC VI §2).

An element of a convolution output is a float64 sum of ``K`` exact products. Summed in one go
(any order) its error is bounded by ``γ_K·S``, and a weight gradient's ``K`` is the batch times
the image (8,192 terms for 32 images of 16×16): a bound that reaches the cap of SPEC VI §2 on
every element that cancels, so its log entry is kept on a quarter of them, each one a rounding
a worker could steer. Blocked, the terms are split into blocks of whole units of at most
``BLOCK`` products where a unit is that small (input channels of the kernel window for a
``convolution``; images for the weight and bias gradients of ``convolution_backward``), each
block is summed by any float64 kernel and the block sums are added by compensated summation
(:func:`sum_parts`, :func:`neumaier_add`: error at most ``(2u + O(m·u²))·Σ|block sums|``):

    |v − Σ x_i| ≤ γ_B·S + 2u·(1 + γ_B)·S + (bias) ≤ γ_(B+4)·S

for blocks of ``B`` terms (``u = 2^-53``), so SPEC VI §2 puts ``K' = B + 8`` in ``γ`` wherever
that is below ``K`` (:func:`block_terms`). The input gradient of ``convolution_backward`` is not
blocked: a sum over output channels and the window (144 to 4,608 terms in common nets) whose
blocking by channels cost three times its time here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
import torch

#: SPEC VI §2: the most products in one block of a blocked sum.
BLOCK = 64
#: SPEC VI §2: ``K' = (terms per block) + SLACK``: the block sums' addition (``2u``), a bias and
#: a rounding of the result, with room to spare.
SLACK = 8

Conv = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]


@numba.njit(cache=True, nogil=True)
def _neumaier_rows(p, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    """``out[i] = Σ_j p[j, i]`` by Kahan–Babuška–Neumaier summation over ``j`` in order."""
    for i in range(p.shape[1]):
        s = p[0, i]
        c = 0.0
        for j in range(1, p.shape[0]):
            x = p[j, i]
            t = s + x
            if abs(s) >= abs(x):
                c += (s - t) + x
            else:
                c += (x - t) + s
            s = t
        out[i] = s + c


@numba.njit(cache=True, nogil=True)
def neumaier_add(p, s, c):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    """Add the rows ``p[j]`` in order to the running compensated sums ``(s, c)`` (flat)."""
    for j in range(p.shape[0]):
        for i in range(p.shape[1]):
            x = p[j, i]
            t = s[i] + x
            if abs(s[i]) >= abs(x):
                c[i] += (s[i] - t) + x
            else:
                c[i] += (x - t) + s[i]
            s[i] = t


def sum_rows(p: np.ndarray) -> np.ndarray:
    """``Σ_j p[j]`` of a C-contiguous float64 ``(m, n)`` array, as :func:`sum_parts`."""
    out = np.empty(p.shape[1])
    _neumaier_rows(p, out)
    return out


def sum_parts(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``Σ parts`` (float64 CPU tensors of one shape) by compensated summation, elementwise:
    within ``(2u + O(m·u²))·Σ|parts|`` of the exact sum (Neumaier; ``u = 2^-53``), and the same
    bits on every machine (IEEE-754 float64 operations in a fixed order, no fast-math).

    >>> a = torch.tensor([1e16], dtype=torch.float64)
    >>> float(sum_parts([a, torch.ones(1, dtype=torch.float64), -a]))
    1.0
    """
    if not parts:
        raise ValueError("sum of no parts")
    if len(parts) == 1:
        return parts[0]
    if any(p.device.type != "cpu" for p in parts):
        return sum2(parts)
    stacked = torch.stack([p.contiguous() for p in parts]).reshape(len(parts), -1)
    return torch.from_numpy(sum_rows(stacked.numpy())).reshape(parts[0].shape)


def sum2(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``Σ parts`` (float64, same shape) with an error below ``2u·Σ|parts|``, ``u = 2^-53``
    (any device; :func:`sum_parts` is the faster CPU path).

    A pairwise tree of error-free additions (TwoSum: ``s = a ⊕ b`` and its exact error ``e``);
    the errors are added up in float64 beside the tree and to its sum at the end (Ogita, Rump
    and Oishi's Sum2, pairwise): the result is within ``u·|Σ| + O(L²u²)·Σ|parts|`` of the
    exact sum for ``L`` levels. Every step is one IEEE-754 float64 operation, so the result
    does not depend on the machine.

    >>> a = torch.tensor([1e16], dtype=torch.float64)
    >>> float(sum2([a, torch.ones(1, dtype=torch.float64), -a]))
    1.0
    """
    if not parts:
        raise ValueError("sum2 of no parts")
    vals = list(parts)
    errs: list[torch.Tensor | None] = [None] * len(vals)
    while len(vals) > 1:
        nv: list[torch.Tensor] = []
        ne: list[torch.Tensor | None] = []
        for i in range(0, len(vals) - 1, 2):
            a, b = vals[i], vals[i + 1]
            s = a + b
            bb = s - a
            e = (a - (s - bb)) + (b - bb)
            for prev in (errs[i], errs[i + 1]):
                if prev is not None:
                    e = e + prev
            nv.append(s)
            ne.append(e)
        if len(vals) % 2:
            nv.append(vals[-1])
            ne.append(errs[-1])
        vals, errs = nv, ne
    return vals[0] if errs[0] is None else vals[0] + errs[0]


def _prod(xs: Sequence[int]) -> int:
    return math.prod(int(x) for x in xs)


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    return [(i, min(n, i + size)) for i in range(0, n, size)]


def _per_block(window: int) -> int:
    """Whole units (channels or images) of ``window`` terms each per block: at least one."""
    return max(1, BLOCK // max(1, window))


def block_terms(name: str, args: Sequence[Any], k: Sequence[int | None]) -> list[int | None]:
    """``K'`` of each output of a convolution call (SPEC VI §2): ``γ``'s term count.

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
    """``K'`` of a sum over ``units`` units of ``window`` terms, blocked by whole units."""
    if k is None:
        return None
    ub = _per_block(window)
    if units <= ub:
        return k  # one block: the plain sum
    return min(k, ub * (window if per is None else per) + SLACK)


def _group_index(groups: int, per_group: int, lo: int, hi: int, device: Any) -> torch.Tensor:
    """Channel indices ``g·per_group + c`` for every group ``g`` and ``lo <= c < hi``."""
    g = torch.arange(groups, device=device).unsqueeze(1) * per_group
    return (g + torch.arange(lo, hi, device=device).unsqueeze(0)).reshape(-1)


def convolution(args: Sequence[Any], conv: Conv, func: Any, fast: bool = False) -> torch.Tensor:
    """``aten.convolution`` on float64 ``args``, blocked by input channels (SPEC VI §2).

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

    stack = kernels64.convolution_blocks(tuple(a), ub) if fast else None
    if stack is not None:  # (blocks, N, Co, Ho, Wo)
        out = sum_rows(stack.reshape(stack.shape[0], -1))
        return _with_bias(torch.from_numpy(out.reshape(stack.shape[1:])), bias)
    parts = []
    for lo, hi in _chunks(units, ub):
        idx = _group_index(groups, units, lo, hi, x.device)
        xs = x.index_select(1, idx) if groups > 1 else x[:, lo:hi]
        # weight: (out, in/g, ...) or, transposed, (in, out/g, ...)
        ws = w.index_select(0, idx) if transposed else w[:, lo:hi]
        parts.append(conv(func, (xs, ws, None, *a[3:]), {}))
    return _with_bias(sum_parts(parts), bias)


def _with_bias(out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is None:
        return out
    return out + bias.reshape([1, -1] + [1] * (out.dim() - 2))


def convolution_backward(
    args: Sequence[Any], conv: Conv, func: Any, fast: bool = False
) -> tuple[Any, Any, Any]:
    """``aten.convolution_backward`` on float64 ``args`` (SPEC VI §2): the weight and bias
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
            outs = [conv(func, (go[lo:hi], x[lo:hi], w, *rest, wmask), {}) for lo, hi in
                    _chunks(n, nb)]  # fmt: skip
            gw = sum_parts([o[1] for o in outs]) if mask[1] else None
            gb = sum_parts([o[2] for o in outs]) if mask[2] else None
    return gi, gw, gb


_BLOCKED = {"convolution": convolution, "convolution_backward": convolution_backward}


def is_blocked(func: Any) -> bool:
    """Whether the ATen call ``func`` is a blocked site (SPEC VI §2): the ``default``
    overloads of ``convolution`` and ``convolution_backward`` (others write an ``out=``)."""
    return func._overloadname == "default" and func.overloadpacket.__name__ in _BLOCKED


def run(func: Any, args: Sequence[Any], conv: Conv, fast: bool = False) -> Any:
    """``func(*args)`` (float64, positional) blocked as SPEC VI §2 says, each block through
    ``conv(func, args, kwargs)`` (``fast``: ``kernels64``'s blocked kernels where they apply)."""
    return _BLOCKED[func.overloadpacket.__name__](args, conv, func, fast)
