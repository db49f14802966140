"""The rounding-log backend: exact replay of any float32 PyTorch model (SPEC VI).

:class:`RoundedMode` is a ``TorchDispatchMode`` that sees every ATen operation of forward,
backward and optimizer alike. Operations fall in four classes (SPEC VI §1, ``ops.py``):

* **exact** operations (data movement, and float32 arithmetic that IEEE-754 rounds once:
  ``add``/``sub`` without ``alpha``, ``mul``, ``div``, ``sqrt``, comparisons, ReLU, max, ...)
  run untouched: their float32 result is the same on every thread count;
* **split** operations (``add`` with ``alpha``, ``addcmul``, ``addcdiv``, ``lerp``) run as
  separately rounded float32 operations (``split.py``);
* **covered** operations (reductions: matmul, conv, sums, norms, softmax, losses; transcendental
  elementwise kernels whose vectorised and scalar paths differ) run on float64 copies of their
  float32 inputs; every float64 output is a *rounding site*, rounded to float32 here
  (:meth:`RoundedMode.round_site`), where the log is written (record) or followed (replay);
  the outputs of matrix products, convolutions and sums are *bounded* sites (``bounds.py``):
  an a-priori error bound valid for any summation order gives each element its own threshold,
  at most ``T_CAP`` (SPEC VI §2), so another BLAS or GPU kernel replays them too (on the
  CPU, matrix products and convolutions run through ``kernels64.py``, faster than ATen's
  float64 kernels; ``RoundedMode.fast_kernels = False`` keeps ATen's);
* anything else on floating tensors raises :class:`UnsupportedOp` at record time.

In-place and ``out=`` covered operations (batch-norm running statistics, ``_foreach_norm``
outputs) run on the float64 copies and the rounded result is written back into the caller's
tensor.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dk.crypto.hashing import tagged_hash
from dk.errors import FormatError
from dk.pol.backends import bf16, blocked, devscan, kernels64
from dk.pol.backends import ops as op_tables
from dk.pol.backends._scan import Outer, bounded_scan, round_scan
from dk.pol.backends.bounds import (
    C_MISSING,
    C_RECORD,
    Bound,
    bound_cap,
    site_bounds,
    thresholds,
)
from dk.pol.backends.log import (
    DEFAULT_TAU_LOG2,
    EMPTY_TRACE,
    LOG_INVALID,
    LOG_MISSING,
    MAX_ENTRIES,
    MAX_SITES,
    MAX_TAU_LOG2,
    MIN_TAU_LOG2,
    TAG_TRACE,
    TRACE_MISMATCH,
    RoundingLog,
)
from dk.pol.backends.pool import Pool
from dk.pol.backends.split import run_rounded64, run_split

_M29 = (1 << 29) - 1
_HALF = 1 << 28
_TINY = 2.0**-125  # below this |value| the float32 gap is 2^-149 (subnormal spacing)
_F32 = torch.float32
_F64 = torch.float64
_BF16 = torch.bfloat16
_LOW = (_F32, _BF16)  # the precisions a covered operation's floating inputs may have


class UnsupportedOp(FormatError):
    """An operation the rounded backend cannot make reproducible (SPEC VI §1)."""


class RoundingLogError(FormatError):
    """The log does not fit the verifier's own computation; ``reason`` is the SPEC VI §5 code."""


def boundary_distance(v: np.ndarray) -> np.ndarray:
    """Distance of float64 values to their float32 rounding boundary, in 2^-29 gaps (SPEC VI §2).

    ``0`` means exactly on the midpoint of the two float32 neighbours; ``2**28`` means exactly
    representable. Zero, infinities, NaN and values that round to infinity give ``2**28``.

    >>> boundary_distance(np.array([1.0, 1.0 + 2.0**-24, 1.0 + 2.0**-24 + 2.0**-40]))
    array([268435456,         0,      4096])
    """
    v = np.ascontiguousarray(v, dtype=np.float64).reshape(-1)
    dist: np.ndarray = np.abs((v.view(np.int64) & _M29) - _HALF)
    a = np.abs(v)
    tiny = a < _TINY
    if tiny.any():
        x = a[tiny] * 2.0**149
        dist[tiny] = np.floor(np.abs((x - np.floor(x)) - 0.5) * 2.0**29).astype(np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        bad = ~np.isfinite(v.astype(np.float32)) | (v == 0)
    dist[bad] = _HALF
    return dist


def _band(v: np.ndarray, t_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``(float32 rounding of v, flat indices within t_bits of a boundary)`` (SPEC VI §2).

    ``v`` is flat contiguous float64; ``t_bits`` in units of 2^-29 gap. The fused bit test is
    exact in the float32 normal range; candidates are re-checked, tiny values handled exactly.
    """
    r, idx, any_tiny = round_scan(v, _HALF - t_bits, 2 * t_bits)
    if idx.size:
        idx = idx[boundary_distance(v[idx]) <= t_bits]  # drop non-finite / tiny candidates
    if any_tiny:  # some 0 < |v| < 2^-125: the gap is 2^-149 there
        tiny = np.flatnonzero((v != 0) & (np.abs(v) < _TINY))
        idx = np.union1d(idx, tiny[boundary_distance(v[tiny]) <= t_bits])
    return r, idx


def _neighbour(r: np.ndarray, v: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The float32 neighbour of each ``v`` on the side ``up`` (True: toward +inf)."""
    above = r.astype(np.float64) > v
    step = np.nextafter(r, np.where(up, np.float32(np.inf), np.float32(-np.inf)))
    return np.where(up == above, r, step)  # r already lies on the side asked for


def _followed(v: np.ndarray, up: np.ndarray, low: bool) -> np.ndarray:
    """The values a log's entries give their elements ``v`` (SPEC VI §2): the float32 (``low``:
    bfloat16) neighbour on the side ``up``; a zero is +0, as every site's zero."""
    if low:
        return bf16.neighbour(bf16.rne(v), v, up)
    out: np.ndarray = _neighbour(v.astype(np.float32) + np.float32(0.0), v, up) + np.float32(0.0)
    return out


class RoundedMode(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch: untyped
    """Run a block of training with covered ops in float64, rounded and logged (SPEC VI).

    Use :meth:`record` (a worker) or :meth:`replay` (a verifier), then :meth:`finish`.

    >>> mode = RoundedMode.record(job_id=bytes(32), interval=0)
    >>> with mode:
    ...     y = torch.ones(3, 4) @ torch.ones(4, 2)
    >>> mode.finish().sites
    1
    """

    def __init__(
        self, *, job_id: bytes, interval: int, tau_log2: int, log: RoundingLog | None
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch: TorchDispatchMode is untyped
        if not MIN_TAU_LOG2 <= tau_log2 <= MAX_TAU_LOG2:  # SPEC VI §3; also keeps t < 2^28
            raise ValueError(
                f"rounded backend: tau_log2 {tau_log2} outside [{MIN_TAU_LOG2}, {MAX_TAU_LOG2}]"
            )
        self.job_id, self.interval, self.tau_log2 = job_id, interval, tau_log2
        self.t_bits = 1 << (29 - tau_log2)  # τ = 2^-k of a gap = 2^(29-k) units of 2^-29
        self.replaying = log is not None
        self.sites = 0
        self.trace = EMPTY_TRACE
        self._rec: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
        self._count = 0
        # SPEC VI §2: bounded sites use per-element thresholds (False: every threshold is t,
        # the version-2 rule; for measurements only, a verifier never turns it off)
        self.bounded = True
        # SPEC VI §1: bounded sites' float64 values through kernels64 (NumPy's BLAS, im2col
        # convolutions) on the CPU; False: ATen's float64 kernels (tests, comparisons). Any
        # summation order replays a bounded site, so either side may use either.
        self.fast_kernels = True
        # sites scanned on their own device (devscan.py): None on devices other than the CPU,
        # True everywhere (tests: the device path on CPU tensors), False nowhere. The log and
        # the values are the same either way; only the host copies differ.
        self.device_scan: bool | None = None
        self.error: Exception | None = None
        # (name, shape) of each site, when a recorder compares steps (recording.py)
        self.signatures: list[tuple[str, tuple[int, ...]]] | None = None
        self._given: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._pins: list[tuple[Any, bool]] = []
        # float64 copies and products of covered calls on the CPU, reused (pool.py)
        self.pool = Pool()
        if log is not None:
            self._given = _group(log)
            self._log = log

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: :meth:`__torch_dispatch__` runs as written, not wrapped in
        ``torch._dynamo.disable`` (torch's default for dispatch modes, read once, when the class
        is made). The wrapper costs two Python frames and a frame-evaluation switch on every
        ATen call, several microseconds each (a tenth of a small model's plain training time
        per step), and imports ``torch._dynamo`` on the first one. dk runs rounded training
        eagerly; a model that calls ``torch.compile`` inside the mode would have Dynamo trace
        this method too."""
        return False

    @classmethod
    def record(
        cls, *, job_id: bytes, interval: int, tau_log2: int = DEFAULT_TAU_LOG2
    ) -> RoundedMode:
        """A mode that writes the log of ``interval`` of job ``job_id``."""
        return cls(job_id=job_id, interval=interval, tau_log2=tau_log2, log=None)

    @classmethod
    def replay(cls, log: RoundingLog) -> RoundedMode:
        """A mode that follows ``log`` (check it first with ``log.check_binding``: SPEC VI §4)."""
        return cls(job_id=log.job_id, interval=log.interval, tau_log2=log.tau_log2, log=log)

    # -- the kernels composite operations choose ---------------------------------------------

    def __enter__(self) -> RoundedMode:
        """Activate the mode, with the choices of composite operations pinned (SPEC VI §1).

        Scaled dot-product attention runs as its math decomposition and cuDNN is off while the
        mode is active: the fused attention kernels and cuDNN's batch norm are other ATen
        operations on other devices, so without the pin a CUDA run's sites would not line up
        with a CPU replay's. Both are process-wide torch settings (so one thread at a time may
        run under rounded modes), restored on exit and by :func:`clear_dead_modes`.
        """
        from torch.nn.attention import SDPBackend, sdpa_kernel

        sdpa = sdpa_kernel(SDPBackend.MATH)
        sdpa.__enter__()
        self._pins.append((sdpa, torch.backends.cudnn.enabled))
        torch.backends.cudnn.enabled = False
        try:
            super().__enter__()  # type: ignore[no-untyped-call]  # torch: untyped
        except BaseException:
            self._unpin()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)  # type: ignore[no-untyped-call]  # torch: untyped
        finally:
            self._unpin()

    def _unpin(self) -> None:
        """Restore the settings the last :meth:`__enter__` pinned."""
        sdpa, cudnn = self._pins.pop()
        torch.backends.cudnn.enabled = cudnn
        sdpa.__exit__(None, None, None)

    # -- the dispatch ------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.error is not None:  # dead after its first error (re-raised by finish): a
            return func(*args, **kwargs)  # caller that left it on the stack still computes
        try:
            kind = op_tables.classify(func, args, kwargs)
            if kind == op_tables.EXACT:
                return func(*args, **kwargs)
            if kind == op_tables.ROUNDED64:
                if kwargs.get("rounding_mode") is not None:  # floor/trunc: the CPU's kernel
                    if _off_cpu(args):
                        raise UnsupportedOp(
                            f"rounded backend: {func} with a rounding mode off the CPU (SPEC VI §1)"
                        )
                    return func(*args, **kwargs)
                return run_rounded64(func, args, kwargs)
            if kind == op_tables.COVERED:
                return self._covered(func, args, kwargs)
            if kind == op_tables.SPLIT:
                return run_split(func, args, kwargs)
            if kind == op_tables.DECOMPOSED:  # its parts come back through this mode
                from torch._decomp import decomposition_table

                with self:
                    return decomposition_table[func](*args, **kwargs)
            if kind == op_tables.RANDOM:  # CPU generators fill serially (SPEC VI §1)
                out = _random(func, args, kwargs)
                if any(t.device.type != "cpu" for t in _leaves(out) if _is_float(t)):
                    raise UnsupportedOp(f"rounded backend: {func} off the CPU (SPEC VI §1)")
                return out
            # not in the tables: allowed only when no floating tensor goes in or comes out
            if any(_is_float(t) for t in _leaves((args, kwargs))):
                raise UnsupportedOp(op_tables.unsupported_message(func))
            out = func(*args, **kwargs)
            if any(_is_float(t) for t in _leaves(out)):
                raise UnsupportedOp(op_tables.unsupported_message(func))
            return out
        except FormatError as e:
            self.error = e
            raise

    def _covered(self, func: Any, args: Any, kwargs: Any) -> Any:
        with self.pool.lending():  # the float64 copies and results are dead once it returns
            return self._covered64(func, args, kwargs)

    def _covered64(self, func: Any, args: Any, kwargs: Any) -> Any:
        name = func.__name__
        # float64 straight from the float32 values, without copies (norms, sums)
        got = kernels64.run32(func, args, kwargs) if self._fast else None
        if got is not None:
            out, s = got
            bounds = {} if s is None else site_bounds(func, args, kwargs, out, s)
            res = [self.round_site(o, name, bounds.get(id(o))) for o in _leaves(out)]
            return _rebuilt(out, iter(res))
        flat = _leaves((args, kwargs))
        up: dict[int, torch.Tensor] = {}
        new: list[Any] = []
        low = False  # a bfloat16 input (autocast): the outputs' dtypes come from torch (meta)
        for a in flat:
            if _is_float(a):
                if a.dtype not in _LOW:
                    raise UnsupportedOp(
                        f"rounded backend: {func} on {a.dtype} (jobs are float32, or bfloat16 "
                        "under autocast; SPEC VI §1)"
                    )
                low = low or a.dtype == _BF16
                if id(a) not in up:
                    up[id(a)] = self.pool.upcast(a)
                new.append(up[id(a)])
            elif a is _F32 or a is _BF16:  # a dtype argument: the output's dtype (meta)
                low = low or a is _BF16
                new.append(_F64)
            else:
                new.append(a)
        dtypes = _meta_dtypes(func, args, kwargs) if low else None
        uargs, ukwargs = _rebuilt((args, kwargs), iter(new))
        if self.bounded and blocked.applies(func, ukwargs):  # SPEC VI §1, blocked sums
            out = blocked.run(func, uargs, self._float64, self.fast_kernels)
        else:
            out = self._float64(func, uargs, ukwargs)
        bounds = site_bounds(func, args, kwargs, out) if self.bounded else {}
        written: dict[int, torch.Tensor] = {}
        for t in _written_args(func, args, kwargs):
            if _is_float(t) and id(t) in up:
                with torch.no_grad():
                    t.copy_(self.round_site(up[id(t)], name, dtype=t.dtype))
                written[id(up[id(t)])] = t
        out_flat = _leaves(out)
        res = []
        for i, o in enumerate(out_flat):
            if isinstance(o, torch.Tensor) and id(o) in written:
                res.append(written[id(o)])
            elif isinstance(o, torch.Tensor) and o.dtype == _F64:
                dt = _F32 if dtypes is None else (dtypes[i] or _F32)
                res.append(self.round_site(o, name, bounds.get(id(o)), dtype=dt))
            else:
                res.append(o)
        return _rebuilt(out, iter(res))

    @property
    def _fast(self) -> bool:
        """Whether ``kernels64`` computes what it can (bounded sites only, SPEC VI §2)."""
        return self.fast_kernels and self.bounded

    def _float64(self, func: Any, args: Any, kwargs: Any) -> Any:
        """One float64 call: ``kernels64`` for bounded sites on the CPU, else ATen."""
        out = kernels64.run(func, args, kwargs, self.pool.empty) if self._fast else None
        return func(*args, **kwargs) if out is None else out

    # -- rounding ----------------------------------------------------------------------------

    def round_site(
        self,
        v: torch.Tensor,
        name: str = "",
        bound: Bound | None = None,
        dtype: torch.dtype = _F32,
    ) -> torch.Tensor:
        """Round one float64 output to ``dtype`` (float32, or bfloat16 under autocast), writing
        or following the log (SPEC VI §2).

        ``bound``: the site's a-priori error bound (``bounds.py``), which lowers the threshold
        of each element below the job's ``t``; None: every element's threshold is ``t``.
        """
        site = self.sites
        if site >= MAX_SITES:
            raise UnsupportedOp("rounded backend: more rounding sites than SPEC VI §3 allows")
        self.sites += 1
        if dtype == _BF16:
            name = name + ":bf16"  # SPEC VI §2: the trace binds a bfloat16 site's precision
        elif dtype != _F32:
            raise UnsupportedOp(f"rounded backend: a {dtype} rounding site (SPEC VI §1)")
        nb = name.encode()
        dims = struct.pack(f"<B{v.dim()}Q", v.dim(), *v.shape)
        self.trace = tagged_hash(TAG_TRACE, self.trace, struct.pack("<I", len(nb)), nb, dims)
        if self.signatures is not None:
            self.signatures.append((name, tuple(v.shape)))
        if self._on_device(v, bound):
            r = self._round_on_device(site, v, bound, dtype)
        else:
            r = torch.from_numpy(self._round_on_host(site, v, bound, dtype))
        if dtype == _BF16:
            r = r.to(_BF16)  # exact: r holds bfloat16 values
        r = r.to(v.device).view(v.shape)
        if v.is_contiguous():
            return r
        return torch.empty_strided(v.shape, v.stride(), dtype=dtype, device=v.device).copy_(r)

    def _round_on_host(
        self, site: int, v: torch.Tensor, bound: Bound | None, dtype: torch.dtype
    ) -> np.ndarray:
        """A site rounded on the host (flat; bfloat16 as float32 holding bfloat16 numbers)."""
        vn = v.detach().contiguous().view(-1).cpu().numpy()  # no copy on CPU
        if dtype == _BF16:
            rn = self._round_bf16(site, vn, bound)
        elif self.replaying:
            rn = self._follow(site, vn, bound)
        else:
            if bound is None:
                rn, idx = _band(vn, self.t_bits)
            else:  # SPEC VI §2: the element's own threshold t_e, at most the cap
                rn, idx = self._band_bounded(vn, bound, use_m=False)
            if idx.size:
                ups = rn[idx].astype(np.float64) > vn[idx]
                self._note(site, idx, ups, boundary_distance(vn[idx]))
        return rn

    def _on_device(self, v: torch.Tensor, bound: Bound | None) -> bool:
        """Whether site ``v`` is scanned on its device (``devscan``): on devices other than the
        CPU unless :attr:`device_scan` says otherwise; never for a refining bound (the CPU's
        norm bounds)."""
        if bound is not None and bound.refine:
            return False
        return v.device.type != "cpu" if self.device_scan is None else self.device_scan

    def _round_on_device(
        self, site: int, v: torch.Tensor, bound: Bound | None, dtype: torch.dtype
    ) -> torch.Tensor:
        """A site rounded to ``dtype`` (float32, or bfloat16 returned as float32 holding
        bfloat16 numbers) on its device; only the candidates and the log's elements come to the
        host, where the CPU path's own functions decide (``devscan``'s module docstring says
        why that gives the CPU path's log and values)."""
        low = dtype == _BF16
        vf = v.detach().contiguous().view(-1)
        r = devscan.round_bf16(vf) if low else devscan.round32(vf)
        s = None if bound is None else bound.s_tensor(vf.device)

        def host(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
            if not idx.size:  # no gather, no copy
                return np.empty(0), None if s is None else np.empty(0)
            at = torch.from_numpy(idx).to(vf.device)
            vs = vf[at].cpu().numpy()
            return vs, None if s is None else s[at].cpu().numpy()

        def thr(ve: np.ndarray, se: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
            if se is None or bound is None:
                return np.full(ve.size, float(self.t_bits)), np.full(ve.size, self.t_bits / 2)
            mant = bf16.MANT if low else 23
            return thresholds(ve, se, bound.k, self.t_bits, bound.k_sum, mant=mant)

        dist = bf16.distance if low else boundary_distance
        use_m = self.replaying
        if bound is None:
            t = self.t_bits // 2 if use_m else self.t_bits
            cand = devscan.candidates(vf, t, bf16=low).cpu().numpy()
        else:
            t = bound_cap(self.t_bits) // (2 if use_m else 1)
            coef = (C_MISSING, 0.0) if use_m else (C_RECORD, 2.0)
            k = (bound.k, bound.k_sum)
            cand = devscan.candidates(vf, t, s, k, coef, bf16=low).cpu().numpy()
        vc, sc = host(cand)
        if low:
            sub = np.flatnonzero(dist(vc) <= thr(vc, sc)[1 if use_m else 0])
        elif bound is None:
            sub = _band(vc, t)[1]
        else:
            assert sc is not None
            given = Bound.given(bound.k, sc, bound.k_sum)
            sub = self._scan_bounded(vc, given.s(), given, use_m)[1]
        flagged = cand[sub]
        what = "bfloat16" if low else "float32"
        if not self.replaying:
            if flagged.size:
                vi = vc[sub]
                ri = bf16.rne(vi) if low else vi.astype(np.float32) + np.float32(0.0)
                self._note(site, flagged, ri.astype(np.float64) > vi, dist(vi))
        else:
            elems, ups = self._given.get(site, (_EMPTY, _EMPTY_B))
            gathered: list[np.ndarray] = []  # the entries' values, once checked in range

            def far(e: np.ndarray) -> np.ndarray:
                ve, se = host(e)
                gathered.append(ve)
                out: np.ndarray = dist(ve) > 2 * thr(ve, se)[0]
                return out

            _check_entries(site, vf.numel(), elems, far, what)
            _check_missing(site, flagged, elems, what)
            if elems.size:
                nb = torch.from_numpy(_followed(gathered[0], ups, low))
                r[torch.from_numpy(elems).to(vf.device)] = nb.to(vf.device)
        return r

    def _note(self, site: int, idx: np.ndarray, ups: np.ndarray, dist: np.ndarray) -> None:
        """Record entries of one site (SPEC VI §2), within the log's entry limit (§3)."""
        self._count += idx.size
        if self._count > MAX_ENTRIES:
            raise UnsupportedOp("rounded backend: rounding log over its entry limit")
        self._rec.append((site, idx, ups, dist))

    def _round_bf16(self, site: int, v: np.ndarray, bound: Bound | None) -> np.ndarray:
        """A bfloat16 site (SPEC VI §2 with bfloat16's gap): record its entries, or check and
        follow the log's; the rounded values as float32 holding bfloat16 numbers.

        ``bf16.scan`` gives the rounding and the elements within ``t_e`` (record) or ``m_e``
        (replay); the few tiny values, the entries and the flagged elements get their
        distances and thresholds from the NumPy reference (``bf16.distance``, ``thresholds``).
        A refining bound (the CPU's norm bounds) is scanned with its upper bound of ``S``, and
        the elements it flags are decided with ``S`` itself, as :meth:`_band_bounded` does.
        """
        use_m = self.replaying
        which = 1 if use_m else 0
        k = (0, 0) if bound is None else (bound.k, bound.k_sum)
        consts = (C_RECORD, C_MISSING, bound_cap(self.t_bits))

        def scan(s: Any) -> tuple[np.ndarray, np.ndarray, bool]:
            if isinstance(s, Outer):
                s = s.full()
            flat = None if s is None else np.asarray(s, dtype=np.float64).reshape(-1)
            return bf16.scan(v, flat, k, self.t_bits, consts, use_m)

        def thr(e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            if bound is None:
                return np.full(e.size, float(self.t_bits)), np.full(e.size, self.t_bits / 2)
            return thresholds(v[e], bound.s_at(e), k[0], self.t_bits, k[1], mant=bf16.MANT)

        if bound is None:
            r, idx, any_tiny = scan(None)
        elif not bound.refine:
            r, idx, any_tiny = scan(bound.s())
        else:  # the upper bound flags a superset (thresholds grow with S)
            r, idx, any_tiny = scan(bound.scan_upper())
            if idx.size and bound.whole(idx.size):  # much of the site: scan again with S
                r, idx, any_tiny = scan(bound.s())
            elif idx.size:
                idx = idx[bf16.distance(v[idx]) <= thr(idx)[which]]
        if any_tiny:  # 0 < |v| < 2^-125: exact distances in NumPy
            tiny = np.flatnonzero((v != 0) & (np.abs(v) < _TINY))
            idx = np.union1d(idx, tiny[bf16.distance(v[tiny]) <= thr(tiny)[which]])
        if not self.replaying:
            if idx.size:
                vi = v[idx]
                self._note(site, idx, r[idx].astype(np.float64) > vi, bf16.distance(vi))
            return r
        elems, ups = self._given.get(site, (_EMPTY, _EMPTY_B))
        _check_entries(
            site, v.size, elems, lambda e: bf16.distance(v[e]) > 2 * thr(e)[0], "bfloat16"
        )
        _check_missing(site, idx, elems, "bfloat16")
        if elems.size:
            r[elems] = _followed(v[elems], ups, low=True)
        return r

    def _follow(self, site: int, v: np.ndarray, bound: Bound | None) -> np.ndarray:
        """Check the log's entries of ``site`` against ``v``; the float32 rounding they give."""
        elems, ups = self._given.get(site, (_EMPTY, _EMPTY_B))

        def far(e: np.ndarray) -> np.ndarray:
            t_e = self._thresholds(v, e, bound)[0]
            out: np.ndarray = boundary_distance(v[e]) > 2 * t_e
            return out

        _check_entries(site, v.size, elems, far, "float32")
        if bound is None:
            r, need = _band(v, self.t_bits // 2)
        else:  # SPEC VI §2: D <= m_e, the verifier's own m_e
            r, need = self._band_bounded(v, bound, use_m=True)
        _check_missing(site, need, elems, "float32")
        if elems.size:
            r[elems] = _followed(v[elems], ups, low=False)
        return r

    def _band_bounded(
        self, v: np.ndarray, bound: Bound, *, use_m: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(float32 rounding of v, elements with D <= t_e)`` (``use_m``: ``D <= m_e``)."""
        which = 1 if use_m else 0
        r, idx = self._scan_bounded(v, bound.scan_upper(), bound, use_m)
        if bound.refine and idx.size:  # s_upper bounds S from above
            if bound.whole(idx.size):  # much of the site: scan again with the whole S
                return self._scan_bounded(v, bound.s(), bound, use_m)
            thr = thresholds(v[idx], bound.s_at(idx), bound.k, self.t_bits, bound.k_sum)[which]
            idx = idx[boundary_distance(v[idx]) <= thr]  # the flagged, with their own S
        return r, idx

    def _scan_bounded(
        self, v: np.ndarray, s: np.ndarray | Outer, bound: Bound, use_m: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """One scan of ``v`` with ``s`` (``S`` or an upper bound of it, flat or as factors)."""
        cap = bound_cap(self.t_bits)
        consts = (C_RECORD, C_MISSING, cap, cap // 2)
        r, idx, any_tiny = bounded_scan(v, s, (bound.k, bound.k_sum), consts, use_m)
        if any_tiny:  # 0 < |v| < 2^-125: exact distances and thresholds in NumPy
            tiny = np.flatnonzero((v != 0) & (np.abs(v) < _TINY))
            s_tiny = s.at(tiny) if isinstance(s, Outer) else s[tiny]
            thr = thresholds(v[tiny], s_tiny, bound.k, self.t_bits, bound.k_sum)
            idx = np.union1d(idx, tiny[boundary_distance(v[tiny]) <= thr[1 if use_m else 0]])
        return r, idx

    def _thresholds(
        self, v: np.ndarray, idx: np.ndarray, bound: Bound | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(t_e, m_e)`` of elements ``idx`` of a site (SPEC VI §2), units of 2^-29 gap."""
        if bound is None:
            return np.full(idx.size, float(self.t_bits)), np.full(idx.size, self.t_bits / 2)
        return thresholds(v[idx], bound.s_at(idx), bound.k, self.t_bits, bound.k_sum)

    def finish(self) -> RoundingLog:
        """End the interval: the recorded log, or (replay) check the site count and trace."""
        self.pool.clear()
        if self.error is not None:
            raise self.error
        if self.replaying:
            if self.sites != self._log.sites or self.trace != self._log.trace:
                extra = [s for s in self._given if s >= self.sites]
                code = LOG_INVALID if extra else TRACE_MISMATCH
                raise RoundingLogError(
                    f"rounding log: the verifier ran {self.sites} rounding sites "
                    f"(trace {self.trace.hex()[:12]}…), the log claims {self._log.sites} "
                    f"(trace {self._log.trace.hex()[:12]}…)",
                    reason=code,
                )
            return self._log
        entries = [
            (site, e, int(u))
            for site, idx, ups, _ in self._rec
            for e, u in zip(idx.tolist(), ups.tolist(), strict=True)
        ]
        return RoundingLog(
            self.job_id, self.interval, self.tau_log2, self.sites, self.trace, entries
        )

    def distances(self) -> list[int]:
        """Boundary distance (2^-29 gaps) of each recorded entry, in log order (diagnostics)."""
        return [d for _, _, _, dist in self._rec for d in dist.tolist()]


def _leaves(x: Any, out: list[Any] | None = None) -> list[Any]:
    """The leaves of an ATen call's arguments or results (tensors, numbers, dtypes, None, …)
    in order, opening tuples (named ones too), lists and dicts, as ``torch.utils._pytree``
    does for these: a few times faster on the dispatch path, which calls it for every
    covered operation."""
    out = [] if out is None else out
    if isinstance(x, list | tuple):
        for y in x:
            _leaves(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _leaves(y, out)
    else:
        out.append(x)
    return out


def _rebuilt(x: Any, new: Iterator[Any]) -> Any:
    """``x`` with its leaves (:func:`_leaves`' order) replaced by the next items of ``new``."""
    if isinstance(x, list | tuple):
        items = [_rebuilt(y, new) for y in x]
        kind = type(x)
        if kind is tuple or kind is list:
            return kind(items)
        return kind(*items) if hasattr(kind, "_fields") else kind(items)  # namedtuple, structseq
    if isinstance(x, dict):
        return {k: _rebuilt(v, new) for k, v in x.items()}
    return next(new)


_EMPTY = np.empty(0, dtype=np.int64)
_EMPTY_B = np.empty(0, dtype=bool)


def _check_entries(
    site: int, size: int, elems: np.ndarray, far: Callable[[np.ndarray], np.ndarray], what: str
) -> None:
    """SPEC VI §2 replay rule 1: each entry names an element of the site, within twice its
    threshold of a ``what`` rounding boundary in the verifier's own computation."""
    if not elems.size:
        return
    if int(elems[-1]) >= size:
        raise RoundingLogError(
            f"rounding log: site {site} has {size} elements, entry names {int(elems[-1])}",
            reason=LOG_INVALID,
        )
    bad = far(elems)
    if bad.any():
        raise RoundingLogError(
            f"rounding log: site {site} element {int(elems[bad][0])} is not within twice its "
            f"threshold of a {what} rounding boundary in the verifier's computation",
            reason=LOG_INVALID,
        )


def _check_missing(site: int, need: np.ndarray, elems: np.ndarray, what: str) -> None:
    """SPEC VI §2 replay rule 2: every element within its ``m_e`` has an entry."""
    if not need.size:
        return
    # ``elems`` is strictly increasing (SPEC VI §3), so a binary search finds each needed one
    at = np.searchsorted(elems, need).clip(max=max(elems.size - 1, 0))
    missing = need if not elems.size else need[elems[at] != need]
    if missing.size:
        raise RoundingLogError(
            f"rounding log: site {site} element {int(missing[0])} lies within τ/2 of a {what} "
            "rounding boundary but the log has no entry for it",
            reason=LOG_MISSING,
        )


def _group(log: RoundingLog) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """A log's entries by site: (elements, directions). The replay rules search the elements,
    so :meth:`RoundingLog.groups` refuses entries out of order (``decode_log`` already does;
    this covers a log built in memory)."""
    return {
        s: (np.array(es, dtype=np.int64), np.array(ds, dtype=bool)) for s, es, ds in log.groups()
    }


def _random(func: Any, args: Any, kwargs: Any) -> Any:
    """``rand`` as is; ``uniform(from, to)`` as a ``[0, 1)`` fill, then ``⊗ f32(to − from)``
    and ``⊕ f32(from)`` as two float32 operations (SPEC VI §1): torch's own kernel fuses them
    into a multiply-add on some CPUs and not on others."""
    if func.overloadpacket.__name__.rstrip("_") != "uniform":
        return func(*args, **kwargs)
    v = dict(zip(("self", "from", "to"), args, strict=False))
    lo, hi = (
        float(kwargs.get("from", v.get("from", 0.0))),
        float(kwargs.get("to", v.get("to", 1.0))),
    )
    gen = kwargs.get("generator")
    self_ = v["self"]
    u = func(self_, 0.0, 1.0, generator=gen)
    if (lo, hi) == (0.0, 1.0):
        return u
    r = torch.add(torch.mul(u, _f32_scalar(hi - lo, u)), _f32_scalar(lo, u))
    if func.overloadpacket.__name__.endswith("_"):
        return self_.copy_(r)
    return r


def _meta_dtypes(func: Any, args: Any, kwargs: Any) -> list[torch.dtype | None]:
    """The dtype torch gives each output (flattened) of ``func`` on these arguments, from the
    meta device (no data): float32 or bfloat16 under autocast, by torch's own rules."""
    from torch.utils._pytree import tree_map

    def meta(a: Any) -> Any:
        return a.to("meta") if isinstance(a, torch.Tensor) else a

    try:
        out = func(*tree_map(meta, args), **tree_map(meta, kwargs))
    except (NotImplementedError, RuntimeError) as e:  # no meta kernel: dtypes unknown
        raise UnsupportedOp(
            f"rounded backend: {func} on bfloat16 has no meta kernel to give its output dtypes "
            "(SPEC VI §1)"
        ) from e
    return [o.dtype if isinstance(o, torch.Tensor) else None for o in _leaves(out)]


def _off_cpu(args: Any) -> bool:
    """Whether a floating tensor among ``args`` lives off the CPU."""
    return any(_is_float(t) and t.device.type != "cpu" for t in _leaves(args))


def _f32_scalar(x: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(x, dtype=like.dtype, device=like.device)


def _is_float(a: object) -> bool:
    return isinstance(a, torch.Tensor) and a.is_floating_point()


# Ops that write arguments their schema does not mark ``(a!)``: name -> (flag index, written).
_UNMARKED_WRITES = {"native_batch_norm": (5, (3, 4))}


_WRITES: dict[Any, tuple[tuple[int, str, bool], ...]] = {}


def _written_args(func: Any, args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensors an op writes (schema ``Tensor(a!)`` arguments), in schema order."""
    out: list[torch.Tensor] = []
    unmarked = _UNMARKED_WRITES.get(func.overloadpacket.__name__)
    if unmarked is not None:  # native_batch_norm updates running stats when training
        flag, idx = unmarked
        if len(args) > flag and args[flag]:
            out.extend(args[i] for i in idx if isinstance(args[i], torch.Tensor))
    writes = _WRITES.get(func)
    if writes is None:  # the schema's written arguments, once per operation
        writes = tuple(
            (i, a.name, a.kwarg_only)
            for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
        _WRITES[func] = writes
    for i, name, kwarg_only in writes:
        val = args[i] if i < len(args) and not kwarg_only else kwargs.get(name)
        if isinstance(val, torch.Tensor):
            out.append(val)
        elif isinstance(val, list | tuple):
            out.extend(t for t in val if isinstance(t, torch.Tensor))
    return out


def clear_dead_modes() -> int:
    """Pop rounded modes that died on an error (and were left on this thread's dispatch stack
    by a loop that never finished its Recorder) from the top of the stack; how many."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode

    n = 0
    while (stack := _get_current_dispatch_mode_stack()) and (
        isinstance(stack[-1], RoundedMode) and stack[-1].error is not None
    ):
        mode = _pop_mode()
        while isinstance(mode, RoundedMode) and mode._pins:  # its pinned settings, restored
            mode._unpin()
        n += 1
    return n


def run_rounded(fn: Callable[[], Any], *, mode: RoundedMode) -> tuple[Any, RoundingLog]:
    """Run ``fn()`` under ``mode`` and finish it: ``(fn's result, log)``."""
    with mode:
        result = fn()
    return result, mode.finish()
