"""Fused elementwise arithmetic split into float32 operations that round once (SPEC VI §1).

``add``/``sub`` with ``alpha ≠ 1``, ``addcmul``, ``addcdiv`` and ``lerp`` (and their
``_foreach_`` forms) may run as fused multiply-adds in one kernel path and as two roundings in
another. The rounded backend computes them as::

    add(a, b, α)          = a ⊕ (b ⊗ f32(α))        sub: a ⊖ (b ⊗ f32(α))
    rsub(a, b, α)         = b ⊖ (a ⊗ f32(α))
    addcmul(s, t1, t2, v) = s ⊕ (f32(v) ⊗ (t1 ⊗ t2))
    addcdiv(s, t1, t2, v) = s ⊕ (f32(v) ⊗ (t1 ⊘ t2))
    lerp(s, e, w)         = s ⊕ (w ⊗ (e ⊖ s))

each ``⊕ ⊗ ⊘ ⊖`` a separate, correctly rounded float32 operation, so the result is the same
on every thread count and device. No log is needed.

``⊘`` and the **correctly rounded** operations (``div``, ``sqrt``, ``reciprocal`` and their
``_foreach_`` forms, :func:`run_rounded64`) run on float64 copies of their float32 operands and
round once to float32: a float64 quotient, square root or reciprocal of float32 operands rounds
to the correctly rounded float32 result (double rounding is innocuous for these operations
when the wider format has at least ``2p + 2`` bits, 53 ≥ 2·24 + 2). torch's own float32 kernels
are not all correctly rounded: the CPU's ``sqrt`` differs from IEEE-754 in about a fifth of the
elements (torch 2.11 and 2.13), and CUDA divides by a host scalar as a multiplication by its
reciprocal. This is one rule that gives the same bits on every device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dk.pol.backends import elementwise
from dk.pol.backends import ops as op_tables

_F32 = torch.float32
_F64 = torch.float64
_BF16 = torch.bfloat16


def _f32(x: Any, like: torch.Tensor) -> Any:
    """A Python scalar as a float32 0-d tensor (round to nearest); tensors pass."""
    if isinstance(x, torch.Tensor):
        return x
    return torch.tensor(float(x), dtype=_F32, device=like.device)


def _one(
    base: str, v: dict[str, Any], i: int | None, into: torch.Tensor | None = None
) -> torch.Tensor:
    """One operation (list element ``i`` of a ``_foreach_`` form); the result is written
    into ``into`` when the one-pass kernel takes it (``elementwise.py``), else a new tensor."""

    def get(name: str) -> Any:
        x = v[name]
        return x[i] if i is not None and isinstance(x, list | tuple) else x

    s = get("self")
    if base == "rsub":  # rsub(a, b, α) = b ⊖ (a ⊗ f32(α)); no one-pass kernel
        return torch.sub(_f32(get("other"), s), torch.mul(s, _f32(v.get("alpha", 1), s)))
    b: Any = None
    if base in ("add", "sub"):
        a, scalar = get("other"), v.get("alpha", 1)
    elif base in ("addcmul", "addcdiv"):  # _foreach_ ScalarList: get gives element i's
        a, b = get("tensor1"), get("tensor2")
        scalar = get("scalars") if "scalars" in v else v.get("value", 1)
        if isinstance(scalar, torch.Tensor) and scalar.dim() == 1 and i is not None:
            scalar = scalar[i]  # _foreach_addc*.Tensor: one scalar per list element
    elif base == "lerp":  # lerp: end, weight; _foreach_lerp: tensors1, weight (or weights)
        a = get("end") if "end" in v else get("tensors1")
        scalar = get("weight") if "weight" in v else get("weights")
    else:
        raise AssertionError(base)
    fast: torch.Tensor | None = elementwise.split(base, s, a, b, scalar, into)
    if fast is not None:
        return fast
    if base in ("add", "sub"):
        t = torch.mul(_f32(a, s), _f32(scalar, s))
        return torch.add(s, t) if base == "add" else torch.sub(s, t)
    if base == "lerp":
        return torch.add(s, torch.mul(_f32(scalar, s), torch.sub(a, s)))
    t = torch.mul(a, b) if base == "addcmul" else _rounded64("div", a, b)
    return torch.add(s, torch.mul(_f32(scalar, s), t))


def run_split(func: Any, args: Any, kwargs: Any) -> Any:
    """Run one fused op as separately rounded float32 operations (in-place and out= honoured)."""
    name = func.overloadpacket.__name__
    inplace = name.endswith("_")
    base = name.rstrip("_").removeprefix("_foreach_")
    v = op_tables.bind(func, args, kwargs)
    if name.startswith("_foreach_"):  # every result first, then written (lists may alias)
        res = [_one(base, v, i) for i in range(len(v["self"]))]
        if inplace:
            for t, r in zip(v["self"], res, strict=True):
                t.copy_(r)
            return None
        return res
    r = _one(base, v, None, v["self"] if inplace else None)
    if inplace:
        return r if r is v["self"] else v["self"].copy_(r)
    if v.get("out") is not None:
        return v["out"].copy_(r)
    return r


def _as64(x: Any, like: torch.Tensor) -> torch.Tensor:
    """An operand converted as torch's type promotion to float32 does, then exactly to float64,
    on ``like``'s device (a number or 0-d CPU tensor becomes ``f32(x)``)."""
    if isinstance(x, torch.Tensor) and not (x.dim() == 0 and x.device != like.device):
        return x.to(_F32).to(_F64)
    value = x.item() if isinstance(x, torch.Tensor) else x
    return torch.tensor(float(np.float32(value)), dtype=_F64, device=like.device)


def _rounded64(
    base: str, a: torch.Tensor, b: Any, into: torch.Tensor | None = None
) -> torch.Tensor:
    """One correctly rounded operation; a bfloat16 result (autocast) is the float32 result
    rounded once more, as torch's bfloat16 kernels compute in float32 (SPEC VI §1). The
    result is written into ``into`` when the one-pass kernel takes it (``elementwise.py``)."""
    fast = elementwise.rounded64(base, a, b, into)
    if fast is not None:
        return fast  # type: ignore[no-any-return]
    fn = torch.sqrt if base == "sqrt" else torch.reciprocal
    if base == "div":
        dt = torch.result_type(a, b)
    else:  # an integer tensor's square root or reciprocal is of the default float dtype
        dt = a.dtype if a.is_floating_point() else torch.get_default_dtype()
    if dt not in (_F32, _BF16):
        return torch.div(a, b) if base == "div" else fn(a)
    q = torch.div(_as64(a, a), _as64(b, a)) if base == "div" else fn(a.to(_F32).to(_F64))
    r = q.to(_F32)
    return r if dt == _F32 else r.to(_BF16)


def run_rounded64(func: Any, args: Any, kwargs: Any) -> Any:
    """``div`` (true division), ``sqrt``, ``reciprocal`` and their ``_foreach_`` forms of float32
    tensors, correctly rounded on every device (in-place and ``out=`` honoured)."""
    name = func.overloadpacket.__name__
    inplace = name.endswith("_")
    base = name.rstrip("_").removeprefix("_foreach_")
    v = op_tables.bind(func, args, kwargs)
    other = next((v[k] for k in ("other", "scalar", "scalars") if k in v), None)
    if name.startswith("_foreach_"):
        others = other if isinstance(other, list | tuple) else [other] * len(v["self"])
        # every result first, then written (the lists may alias each other)
        res = [_rounded64(base, t, o) for t, o in zip(v["self"], others, strict=True)]
        if inplace:
            for t, r in zip(v["self"], res, strict=True):
                t.copy_(r)
            return None
        return res
    r = _rounded64(base, v["self"], other, v["self"] if inplace else None)
    if inplace:
        return r if r is v["self"] else v["self"].copy_(r)
    if v.get("out") is not None:
        return v["out"].copy_(r)
    return r
