"""One-pass CPU kernels for the split and correctly rounded elementwise operations (SPEC VI §1).

``split.py`` defines these operations as chains of separately rounded float32 operations
(``addcmul(s, t1, t2, v) = s ⊕ (f32(v) ⊗ (t1 ⊗ t2))``) and as float64 operations rounded
once (``div``, ``sqrt``, ``reciprocal``), and computes them with torch: one kernel call and one
temporary tensor per operation, plus float64 copies of the operands. An optimizer step is
made of them (Adam: ``lerp_``, ``addcmul_``, ``sqrt``, ``div``, ``addcdiv_`` per parameter),
so on a large model they cost more than the step's plain fused kernels. Here each runs as
one Numba loop over the elements that performs **the same operations in the same order**:
float32 ``+ - *`` on float32 operands (Numba compiles without fast-math, so LLVM neither
reassociates nor contracts a multiply and an add into a fused multiply-add) and float64
``/``, ``sqrt`` of float32 operands rounded once to float32 (a division by a number: one
float32 ``/``, the same correctly rounded quotient at twice the speed). IEEE-754 fixes every
such result that is a number, so those bits equal the torch chain's, whatever the vector width
(tests compare them on random inputs with infinities, zeros of both signs and subnormals). A NaN
result is a NaN on both paths, but its sign and payload are not fixed: IEEE-754 leaves them
open when two NaNs meet, and LLVM may swap the operands of ``+`` and ``*``. No commitment
depends on them: a NaN anywhere in a checkpoint rejects it (SPEC §12.2, ``TENSOR_INVALID``) and
the Recorder stops at the first update that makes a weight NaN.

Taken: CPU float32 tensors, C-contiguous, all of one shape, and Python ``int``/``float``
scalars (``alpha``, ``value``, ``weight``, a divisor); an in-place result is written into the
tensor itself unless another operand's memory overlaps it in another place. Anything else
(other dtypes and devices, broadcasting, tensor scalars, strided views, ``bool``) returns
``None`` and the caller runs the torch chain. The kernels are serial (the caller's thread):
one pass over the data instead of three to six.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numba
import numpy as np
import torch

from dk.pol.backends._switch import Switch

_F32 = torch.float32

# Number of operations each kernel answered (tests prove the fast path ran).
calls: Counter[str] = Counter()


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _add(a, b, w, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    for i in range(out.size):
        out[i] = a[i] + b[i] * w


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _sub(a, b, w, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    for i in range(out.size):
        out[i] = a[i] - b[i] * w


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _addcmul(s, t1, t2, v, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    for i in range(out.size):
        out[i] = s[i] + v * (t1[i] * t2[i])


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _addcdiv(s, t1, t2, v, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    for i in range(out.size):
        q = np.float32(np.float64(t1[i]) / np.float64(t2[i]))
        out[i] = s[i] + v * q


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _lerp(s, e, w, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    for i in range(out.size):
        out[i] = s[i] + w * (e[i] - s[i])


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _div(a, b, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    for i in range(out.size):
        out[i] = np.float32(np.float64(a[i]) / np.float64(b[i]))


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _div_scalar(a, c, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    # c is float32: IEEE-754 rounds a float32 quotient correctly, so it is the float64
    # quotient rounded once (53 >= 2*24 + 2), in one float32 division (twice as fast)
    for i in range(out.size):
        out[i] = a[i] / c


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _sqrt(a, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    # below zero: torch's positive quiet NaN, not the CPU's negative one (written as bits:
    # LLVM may fold a float select between NaNs into either)
    bits = out.view(np.int32)
    nan = np.int32(0x7FC00000)
    for i in range(out.size):
        x = np.float64(a[i])
        out[i] = np.float32(math.sqrt(x))
        if x < 0.0:
            bits[i] = nan


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _reciprocal(a, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jit
    one = np.float64(1.0)
    for i in range(out.size):
        out[i] = np.float32(one / np.float64(a[i]))


# The kernels by operation: split ones take (operands..., scalar, out), rounded ones
# (operands..., out).
_SPLIT: dict[str, Any] = {
    "add": _add, "sub": _sub, "addcmul": _addcmul, "addcdiv": _addcdiv, "lerp": _lerp,
}  # fmt: skip
_ROUNDED: dict[str, Any] = {"div": _div, "sqrt": _sqrt, "reciprocal": _reciprocal}


def _f32(x: Any) -> np.float32 | None:
    """A Python number as float32 (round to nearest, as ``torch.tensor(x, float32)``)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    try:
        with np.errstate(over="ignore"):  # beyond float32: inf, as torch rounds it
            return np.float32(float(x))
    except OverflowError:  # an int beyond float64: the torch chain decides
        return None


def _fits(t: Any, like: torch.Tensor) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.dtype == _F32
        and t.device.type == "cpu"
        and t.shape == like.shape
        and t.is_contiguous()
        and not t.is_neg()
    )


def _flat(t: torch.Tensor) -> np.ndarray:
    return np.asarray(t.detach().numpy()).reshape(-1)


def _target(tensors: list[Any], into: torch.Tensor | None) -> torch.Tensor | None:
    """The output: ``into`` (in place) if every operand is a float32 tensor of its shape that
    either is ``into`` or shares none of its memory; else a new tensor; None: not taken."""
    like = tensors[0]
    if not all(_fits(t, like) for t in tensors):
        return None
    if into is None:
        return torch.empty_like(like, memory_format=torch.contiguous_format)
    if not _fits(into, like):
        return None
    lo = into.data_ptr()
    hi = lo + into.nbytes  # contiguous: one address range (tensors of other storages too:
    for t in tensors:  # torch.from_numpy or frombuffer views of one buffer)
        p = t.data_ptr()
        if p != lo and p < hi and lo < p + t.nbytes:
            return None  # overlapping in another place: the torch chain's temporaries
    return into


def split(base: str, s: Any, a: Any, b: Any, scalar: Any, into: torch.Tensor | None) -> Any:
    """One split operation of ``split.py`` in one pass, or None (not taken).

    ``base``: ``add``/``sub`` (``s ± a·α``, ``scalar`` = α, ``b`` None), ``addcmul`` /
    ``addcdiv`` (``a``, ``b`` the two tensors, ``scalar`` = value), ``lerp`` (``a`` = end,
    ``scalar`` = weight, ``b`` None). ``into``: the in-place target (None: a new tensor).
    """
    w = _f32(scalar)
    kernel = _SPLIT.get(base)
    if not _switch.on or w is None or kernel is None or not isinstance(s, torch.Tensor):
        return None
    tensors = [s, a] if b is None else [s, a, b]
    out = _target(tensors, into)
    if out is None:
        return None
    kernel(*[_flat(t) for t in tensors], w, _flat(out))
    calls[base] += 1
    return out


def rounded64(base: str, a: Any, b: Any, into: torch.Tensor | None) -> Any:
    """``div`` (by a tensor of ``a``'s shape or a number), ``sqrt`` or ``reciprocal`` of a
    float32 tensor, computed in float64 and rounded once, in one pass; or None (not taken)."""
    if not _switch.on or not isinstance(a, torch.Tensor) or base not in _ROUNDED:
        return None
    if base == "div" and not isinstance(b, torch.Tensor):  # by a number: f64(f32(b))
        c = _f32(b)
        out = None if c is None else _target([a], into)
        if c is None or out is None:
            return None
        _div_scalar(_flat(a), c, _flat(out))
    else:
        tensors = [a, b] if base == "div" else [a]
        out = _target(tensors, into)
        if out is None:
            return None
        _ROUNDED[base](*[_flat(t) for t in tensors], _flat(out))
    calls[base] += 1
    return out


_switch = Switch()
#: Within ``with off():`` :func:`split` and :func:`rounded64` take nothing: ``split.py`` runs its
#: torch chains (the same bits; for comparisons and benchmarks). Process-wide.
off = _switch.off
