"""A-priori error bounds of the covered sums of products: per-element thresholds (SPEC VI §2).

A **bounded** site is an output of a matrix product, a convolution (forward or backward) or a
``sum``/``mean``: each of its elements is a float64 sum of ``K`` exact products of float32
numbers (a float32 product is exact in float64), computed in an order the kernel picks. For any
order, with or without FMA (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1),

    |fl64(Σ x_i) − Σ x_i| ≤ γ_K · S,   γ_K = K·u / (1 − K·u),  u = 2^-53,  S = Σ |x_i|,

so two honest machines' values differ by at most ``2·γ_K·S``. ``S`` is the same operation on
the absolute values of the inputs, computed here in float32 (a sum of non-negative terms: its
relative error is at most about ``K·2^-24`` in any order) on the CPU, in float64 elsewhere;
for a CPU matrix product or 2-D convolution only where a Cauchy–Schwarz bound does not already
clear the element (``normbounds.py``; float64 there).
:func:`thresholds` turns it into the element's threshold in units of ``D`` (2^-29 gap), at most
``T_cap``: the log then holds only elements the bound says could round differently. Outputs
summed in blocks (``blocked.py``, SPEC VI §1) put their blocked term count ``K'`` in ``γ``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from dk.pol.backends._scan import Outer
from dk.pol.backends.blocked import applies, block_terms

# SPEC VI §2: an element of a bounded site is logged within 2.5β + 2 (at most T_cap) of a
# boundary, and the verifier demands an entry within 0.4β (at most T_cap/2); sums over K_MAX
# terms keep t.
C_RECORD = 2.5
C_MISSING = 0.4
K_MAX = 1 << 16
# SPEC VI §2: the largest threshold of a bounded element, 2^-3 of a gap (t if larger).
T_CAP = 1 << 26
_U = 2.0**-53
_TINY = 2.0**-125

# ATen overload packet -> kind of its outputs' term counts (SPEC VI §1 table, "bounded").
BOUNDED_OPS = frozenset(
    "mm bmm addmm baddbmm mv addmv dot addbmm convolution convolution_backward sum mean".split()
)


class Bound:
    """The bound of one site: its term count ``k``, the term count ``k_sum`` of its blocked
    sum (``K'`` of SPEC VI §2, ``blocked.py``; ``k`` where the sum is one block) and
    (computed once per call) ``S``."""

    def __init__(self, k: int, shared: AbsOp | None, index: int, k_sum: int | None = None) -> None:
        self.k, self._shared, self._index = k, shared, index
        self.k_sum = k if k_sum is None else k_sum
        self._s: np.ndarray | None = None

    @classmethod
    def given(cls, k: int, s: Any, k_sum: int | None = None) -> Bound:
        """A bound with a known ``S`` (tests, vectors): ``k`` terms (``k_sum`` blocked), ``s``
        any array-like."""
        b = cls(k, None, 0, k_sum)
        b._s = np.ascontiguousarray(np.asarray(s, dtype=np.float64).reshape(-1))
        return b

    #: Whether :meth:`s_upper` may exceed ``S`` (then decisions are refined by :meth:`s_at`).
    refine = False

    def whole(self, flagged: int) -> bool:
        """Whether a refining bound should compute the whole ``S`` for ``flagged`` elements."""
        return True

    def s(self) -> np.ndarray:
        """``S`` of every element, flat in C order (float32 or float64)."""
        if self._s is None:
            assert self._shared is not None
            self._s = self._shared.get(self._index)
        return self._s

    def s_upper(self) -> np.ndarray:
        """An upper bound of ``S`` of every element, flat (here ``S`` itself)."""
        return self.s()

    def scan_upper(self) -> np.ndarray | Outer:
        """:meth:`s_upper` as the scan takes it: flat, or as factors (:class:`_scan.Outer`)
        where that saves writing an array of the output's size."""
        return self.s_upper()

    def s_at(self, idx: np.ndarray) -> np.ndarray:
        """``S`` of the elements ``idx`` (flat indices)."""
        at: np.ndarray = self.s()[idx]
        return at

    def s_tensor(self, device: torch.device) -> torch.Tensor:
        """``S`` of every element as a flat tensor on ``device`` (where the operation on absolute
        values ran there, without a copy through the host; ``devscan``)."""
        if self._s is None and self._shared is not None:
            t = self._shared.tensor(self._index)
            if t.device == device:
                return t
        return torch.from_numpy(self.s()).to(device)


class AbsOp:
    """The operation on absolute values, run at most once for all outputs of one call (its
    arguments' absolute values are taken then too)."""

    def __init__(self, func: Any, args: Any, kwargs: Any, dtype: torch.dtype) -> None:
        self.func, self.args, self.kwargs, self.dtype = func, args, kwargs, dtype
        self._out: list[Any] | None = None

    def get(self, index: int) -> np.ndarray:
        """Output ``index`` flat in C order, on the host."""
        return np.asarray(self.tensor(index).cpu().numpy())

    def tensor(self, index: int) -> torch.Tensor:
        """Output ``index`` as a flat contiguous tensor on the device the call ran on."""
        if self._out is None:
            memo: dict[int, torch.Tensor] = {}
            dt = self.dtype
            scalars = _scalar_names(self.func)
            names = [a.name for a in self.func._schema.arguments]
            aargs = tuple(
                [_abs(x, dt, memo, False) for x in a]
                if isinstance(a, list)
                else _abs(a, dt, memo, i < len(names) and names[i] in scalars)
                for i, a in enumerate(self.args)
            )
            akwargs = {k: _abs(v, dt, memo, k in scalars) for k, v in self.kwargs.items()}
            if "dtype" in akwargs and akwargs["dtype"] is not None:
                akwargs["dtype"] = dt
            out = self.func(*aargs, **akwargs)
            outs = list(out) if isinstance(out, tuple | list) else [out]
            # SPEC VI §1: S without overflow (float32 past 2^128: again in float64). S is a
            # sum of absolute values, so its elements are finite if their total is (a total
            # past the float32 range alone also sends the call to float64, which §1 allows);
            # one sum is several times cheaper than isfinite's mask
            if dt != torch.float64 and not all(
                math.isfinite(float(t.sum())) for t in outs if isinstance(t, torch.Tensor)
            ):
                self.dtype = torch.float64
                self._out = None
                return self.tensor(index)
            self._out = outs
        t: torch.Tensor = self._out[index]  # float32 on the CPU: promoted where it is used
        return t.detach().contiguous().view(-1)


def _abs(a: Any, dtype: torch.dtype, memo: dict[int, torch.Tensor], scalar: bool) -> Any:
    """``|a|`` for a floating tensor, and for a number where the schema's argument is a
    ``Scalar`` (``scalar``: α, β); other arguments (dimensions, sizes, flags) as given."""
    if isinstance(a, torch.Tensor) and a.is_floating_point():
        if id(a) not in memo:
            memo[id(a)] = a.detach().to(dtype).abs()
        return memo[id(a)]
    if scalar and isinstance(a, float | int) and not isinstance(a, bool):
        return abs(a)
    return a


_SCALARS: dict[Any, frozenset[str]] = {}  # operation -> names of its Scalar arguments


def _scalar_names(func: Any) -> frozenset[str]:
    """Names of ``func``'s ``Scalar`` (or ``Scalar?``) schema arguments, once per operation."""
    names = _SCALARS.get(func)
    if names is None:
        found = set()
        for arg in func._schema.arguments:
            t = arg.type
            if isinstance(t, torch.OptionalType):
                t = t.getElementType()
            if isinstance(t, torch.NumberType):
                found.add(arg.name)
        names = _SCALARS[func] = frozenset(found)
    return names


def _prod(xs: Any) -> int:
    return math.prod(int(x) for x in xs)


def _term_counts(name: str, args: Any, kwargs: Any, outs: list[Any]) -> list[int | None]:
    """``K`` of each output of the call (None: no bound), an upper bound on its sum's terms."""
    a = list(args)
    if name in ("mm", "bmm", "mv"):
        return [int(a[0].shape[-1])]
    if name == "dot":
        return [int(a[0].numel())]
    if name in ("addmm", "baddbmm", "addmv"):  # β·C + α·(A B): two more roundings
        return [int(a[1].shape[-1]) + 2]
    if name == "addbmm":
        return [int(a[1].shape[0]) * int(a[1].shape[-1]) + 2]
    if name == "convolution":
        w, bias, transposed, groups = a[1], a[2], bool(a[6]), int(a[8])
        per = (int(w.shape[0]) // groups if transposed else int(w.shape[1])) * _prod(w.shape[2:])
        return [per + (1 if bias is not None else 0)]
    if name == "convolution_backward":
        go, x, w, transposed, groups = a[0], a[1], a[2], bool(a[7]), int(a[9])
        k_in = (int(w.shape[1]) if transposed else int(w.shape[0]) // groups) * _prod(w.shape[2:])
        n = int(go.shape[0])
        k_w = n * max(_prod(go.shape[2:]), _prod(x.shape[2:]))
        return [k_in, k_w, n * _prod(go.shape[2:])]
    if name in ("sum", "mean"):
        x, out = a[0], outs[0]
        if out.numel() == 0:
            return [None]
        k = int(x.numel()) // int(out.numel())
        return [k + 1 if name == "mean" else k]
    return [None] * len(outs)


_BOUNDED: dict[Any, str | None] = {}  # operation -> its name where site_bounds bounds it


def site_bounds(
    func: Any, args: Any, kwargs: Any, out: Any, s: list[np.ndarray] | None = None
) -> dict[int, Bound]:
    """The bounds of a covered call's float64 outputs, keyed by ``id`` (SPEC VI §2).

    ``args``/``kwargs`` are the caller's float32 arguments, ``out`` the float64 result, ``s``
    each output's ``S`` where the kernel computed it with the result (flat, float64). Empty
    for an operation without a bound or with written (``out=``, in-place) arguments.
    """
    name = _BOUNDED.get(func, "")
    if name == "":  # once per operation: its name, or None (not bounded, or it writes)
        name = func.overloadpacket.__name__
        if name not in BOUNDED_OPS or any(
            a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments
        ):
            name = None
        _BOUNDED[func] = name
    if name is None:
        return {}
    outs = list(out) if isinstance(out, tuple | list) else [out]
    ks = _term_counts(name, args, kwargs, outs)
    kbs = block_terms(name, args, ks) if applies(func, kwargs) else ks
    from dk.pol.backends.normbounds import norm_bound  # it extends Bound: imports this module

    dev = next((o.device for o in outs if isinstance(o, torch.Tensor)), None)
    dtype = torch.float32 if dev is not None and dev.type == "cpu" else torch.float64
    shared = AbsOp(func, args, kwargs, dtype)
    res: dict[int, Bound] = {}
    for i, (o, k, kb) in enumerate(zip(outs, ks, kbs, strict=False)):
        if isinstance(o, torch.Tensor) and k is not None and 0 < k <= K_MAX:
            assert kb is not None
            if s is not None:
                res[id(o)] = Bound.given(k, s[i], kb)
                continue
            res[id(o)] = norm_bound(name, args, kwargs, i, k, kb, shared) or Bound(k, shared, i, kb)
    return res


def bound_cap(t_bits: int) -> int:
    """The largest threshold of a bounded element: ``max(t, T_CAP)`` (SPEC VI §2)."""
    return max(t_bits, T_CAP)


def thresholds(
    v: np.ndarray,
    s: np.ndarray,
    k: int,
    t_bits: int,
    k_sum: int | None = None,
    mant: int = 23,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-element thresholds ``(t_e, m_e)`` in units of ``D`` (SPEC VI §2).

    ``β = γ_K'·S⁺·2^29/g`` bounds one machine's float64 error in units of ``D``, with ``g`` the
    float32 gap at ``v`` (``mant = 7``: the bfloat16 gap, SPEC VI §2), ``K' = k_sum`` (default
    ``K``) the blocked sum's term count and
    ``S⁺ = S·(1 + K·2^-23) + K·2^-149`` (covering the float32 rounding of ``S`` itself, a sum
    of all ``K`` terms); ``t_e = min(T_cap, 2.5β + 2)`` (record, and an entry is accepted
    within ``2·t_e``) and ``m_e = min(T_cap/2, 0.4β)`` (the verifier demands an entry within it).

    >>> t, m = thresholds(np.array([1.0]), np.array([1.0]), 4, 1 << 19)
    >>> round(float(t[0]), 4), round(float(m[0]), 4)
    (7.0, 0.8)
    """
    kg = k if k_sum is None else k_sum
    gamma = kg * _U / (1.0 - kg * _U)
    s = np.asarray(s, dtype=np.float64)
    a = np.abs(v)
    ex = np.frexp(a)[1]
    gap = np.where(a >= _TINY, np.ldexp(1.0, ex - 1 - mant), 2.0 ** (-126 - mant))
    with np.errstate(over="ignore", invalid="ignore"):
        beta = gamma * (s * (1.0 + k * 2.0**-23) + k * 2.0**-149) * 2.0**29 / gap
        cap = float(bound_cap(t_bits))
        t_e: np.ndarray = np.fmin(C_RECORD * beta + 2.0, cap)
        m_e: np.ndarray = np.fmin(C_MISSING * beta, cap / 2)
    return t_e, m_e
