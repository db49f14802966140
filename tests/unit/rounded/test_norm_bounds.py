"""Bounds of ``S`` from norms (``normbounds.py``, SPEC VI §1-§2): matrix products and 2-D
convolutions without a second pass on absolute values.

On the CPU their ``S`` is computed only where a Cauchy–Schwarz upper bound does not already
clear the element. The upper bound must cover ``S`` everywhere, the elements it lets
through must get ``S`` itself, and the log must be the one the whole ``S`` gives: recorded
either way and replayed the other way, bit for bit.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch

from dk.errors import FormatError
from dk.pol.backends import bf16, bounds, normbounds
from dk.pol.backends import examples as ex
from dk.pol.backends._scan import Outer
from dk.pol.backends.bounds import Bound, site_bounds, thresholds
from dk.pol.backends.log import LOG_INVALID, LOG_MISSING, RoundingLog
from dk.pol.backends.rounded import RoundedMode

JOB = bytes(range(32))
aten = torch.ops.aten


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def _small_operations_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Norm bounds for operations of any size (production: ``MIN_MACS`` and up)."""
    monkeypatch.setattr(normbounds, "MIN_MACS", 0)


def test_small_operations_keep_the_pass_on_absolute_values() -> None:
    """Below ``MIN_MACS`` multiply-adds the plain bound, whose ``S`` is one more pass."""
    g = torch.Generator().manual_seed(41)
    a, b = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(normbounds, "MIN_MACS", 8 * 8 * 8 + 1)
        assert type(_bound(aten.mm.default, (a, b), {})) is Bound
        m.setattr(normbounds, "MIN_MACS", 8 * 8 * 8)
        assert type(_bound(aten.mm.default, (a, b), {})).__name__ == "_ProductBound"


def _operands(g: torch.Generator, *shape: int) -> torch.Tensor:
    """Random float32 values over several magnitudes, with zeros and a row of large ones."""
    x = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-8, 8, shape, generator=g))
    x[..., 0, :] *= 1e4
    return torch.where(torch.rand(*shape, generator=g) < 0.1, torch.zeros(()), x)


# (name, operation, args, kwargs, output index, norm bound class)
Case = tuple[str, Any, tuple[Any, ...], dict[str, Any], int, str]


def _conv_cases(g: torch.Generator) -> list[Case]:
    out = []
    # (N, C, H, W, Co, kh, kw, stride, padding, dilation, groups, bias)
    for n, c, h, w, co, kh, kw, st, pd, dl, gr, bias in [
        (2, 6, 9, 11, 8, 3, 3, [1, 1], [1, 1], [1, 1], 1, True),
        (3, 4, 10, 7, 6, 3, 2, [2, 1], [0, 2], [2, 2], 2, False),
        (2, 8, 8, 8, 8, 1, 1, [2, 2], [0, 0], [1, 1], 1, True),
        (1, 3, 12, 12, 4, 5, 5, [1, 2], [2, 2], [1, 1], 1, True),
    ]:
        x, wt = _operands(g, n, c, h, w).clamp_min(0), _operands(g, co, c // gr, kh, kw)
        b = _operands(g, 1, co)[0] if bias else None
        geo = (st, pd, dl, False, [0, 0], gr)
        tag = f"{n}x{c}x{h}x{w} w{co}x{kh}x{kw} s{st} p{pd} d{dl} g{gr}"
        args = (x, wt, b, st, pd, dl, False, [0, 0], gr)
        out.append((f"conv {tag}", aten.convolution.default, args, {}, 0, "_ConvBound"))
        y = aten.convolution.default(*args)
        go = _operands(g, *y.shape)
        bw = (go, x, wt, [co] if bias else None, *geo, [True, True, bias])
        for i, cls in enumerate(("_ConvInputBound", "_ConvWeightBound")):
            out.append((f"conv grad {i} {tag}", aten.convolution_backward.default, bw, {}, i, cls))
    return out


def _cases() -> list[Case]:
    g = torch.Generator().manual_seed(11)
    a, b = _operands(g, 37, 53), _operands(g, 61, 53).t()  # b transposed: a strided view
    c_row, c_full = _operands(g, 1, 61)[0], _operands(g, 37, 61)
    ba, bb = _operands(g, 3, 17, 29), _operands(g, 3, 29, 23)
    bc = _operands(g, 1, 17, 23)
    kw, bkw = {"beta": -0.5, "alpha": 3.0}, {"beta": 2.0, "alpha": -0.25}
    p = torch.randn(8, 4096, generator=g)  # S of p·pᵀ's diagonal is Cauchy–Schwarz's bound
    # A transposed (strided along K: its norms read in its memory order, the flagged elements
    # in row order); a batch whose matrices are not C-contiguous (row stride 3·29): copied
    # before the norms
    at, bk = _operands(g, 53, 37).t(), _operands(g, 53, 61)
    bs = _operands(g, 17, 3, 29).transpose(0, 1)
    return [
        ("mm", aten.mm.default, (a, b), {}, 0, "_ProductBound"),
        ("mm parallel rows", aten.mm.default, (p, p.t()), {}, 0, "_ProductBound"),
        ("addmm bias", aten.addmm.default, (c_row, a, b), {}, 0, "_ProductBound"),
        ("addmm scaled", aten.addmm.default, (c_full, a, b), kw, 0, "_ProductBound"),
        ("mm transposed a", aten.mm.default, (at, bk), {}, 0, "_ProductBound"),
        ("bmm", aten.bmm.default, (ba, bb), {}, 0, "_ProductBound"),
        ("bmm strided batch", aten.bmm.default, (bs, bb), {}, 0, "_ProductBound"),
        ("baddbmm", aten.baddbmm.default, (bc, ba, bb), bkw, 0, "_ProductBound"),
        ("baddbmm bias", aten.baddbmm.default, (bc[0, 0], ba, bb), bkw, 0, "_ProductBound"),
        *_conv_cases(g),
    ]


def _bound(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], index: int = 0) -> Any:
    out = func(*[t.double() if isinstance(t, torch.Tensor) else t for t in args], **kwargs)
    outs = list(out) if isinstance(out, tuple | list) else [out]
    return site_bounds(func, args, kwargs, out)[id(outs[index])]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_upper_bound_covers_s_and_the_flagged_get_s_itself(case: Case) -> None:
    _, func, args, kwargs, index, cls = case
    whole = _bound(func, args, kwargs, index)
    s = whole.s().astype(np.float64)  # the operation on absolute values (float32)
    bound = _bound(func, args, kwargs, index)
    assert bound.refine and type(bound).__name__ == cls
    k = bound.k
    ub = bound.s_upper()
    assert ub.shape == s.shape and (ub >= s * (1 + k * 2.0**-24)).all()
    idx = np.sort(np.random.default_rng(3).choice(s.size, max(1, s.size // 512), replace=False))
    at = bound.s_at(idx)
    np.testing.assert_allclose(at, s[idx], rtol=k * 2.0**-22, atol=0)
    # a few elements: S only there, no pass over the whole site (unless the site is tiny)
    assert (bound._s is None) != bound.whole(idx.size)
    at_all = bound.s_at(np.arange(s.size))  # all of it: S of the whole site, once
    assert bound._s is not None
    np.testing.assert_array_equal(at_all, bound.s())


def _product_bound(args: tuple[Any, ...], kwargs: dict[str, Any]) -> np.ndarray:
    """``|α|·(1 + K·2^-20)·‖A_i‖·‖B_j‖ + |β|·(1 + 2^-20)·|C_ij|``, flat, in float64 in the order
    ``normbounds`` documents (products of three: the scalar first)."""
    c, a, b = args if len(args) == 3 else (None, *args)
    alpha, beta = abs(kwargs.get("alpha", 1)), abs(kwargs.get("beta", 1))
    a64, b64 = a.double().numpy(), b.double().numpy()
    rows = np.sqrt(np.einsum("...ik,...ik->...i", a64, a64))
    cols = np.sqrt(np.einsum("...kj,...kj->...j", b64, b64))
    k = a.shape[-1] + (2 if c is not None else 0)
    ub = (rows * (alpha * (1.0 + k * 2.0**-20)))[..., :, None] * cols[..., None, :]
    if c is not None and beta != 0:
        ub = ub + beta * (1.0 + 2.0**-20) * np.abs(c.double().numpy())
    return np.asarray(ub).reshape(-1)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_the_scan_takes_the_array_bound_as_factors(case: Case) -> None:
    """Matrix products and one-group convolutions (forward, grad input) hand the scan their
    bound as rows and columns (``_scan.Outer``): the same numbers as the array, bit for bit;
    the others the array itself."""
    name, func, args, kwargs, index, cls = case
    bound = _bound(func, args, kwargs, index)
    given = bound.scan_upper()
    as_factors = cls == "_ProductBound" or (cls != "_ConvWeightBound" and " g1" in name)
    assert isinstance(given, Outer) == as_factors
    flat = given.full() if isinstance(given, Outer) else given
    np.testing.assert_array_equal(flat.view(np.int64), bound.s_upper().view(np.int64))
    if cls == "_ProductBound":  # and both are the formula, computed here from the operands
        np.testing.assert_allclose(flat, _product_bound(args, kwargs), rtol=1e-12, atol=0)
    if isinstance(given, Outer):
        idx = np.random.default_rng(5).choice(flat.size, 50)
        np.testing.assert_array_equal(given.at(idx), flat[idx])


def _record(
    kind: str, norm_bounds: bool, monkeypatch: pytest.MonkeyPatch, low: bool = False
) -> Any:
    """One recorded step (after a warm-up step) of example ``kind`` (``low``: under bfloat16
    autocast); its log and the calls whose whole ``S`` was computed."""
    computed: Counter[str] = Counter()
    get = bounds.AbsOp.get

    def counted(self: Any, index: int) -> np.ndarray:
        if self._out is None:
            computed[self.func.overloadpacket.__name__] += 1
        return get(self, index)

    whole = contextlib.nullcontext() if norm_bounds else normbounds.off()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if low else contextlib.nullcontext()
    with monkeypatch.context() as m, whole, autocast:
        m.setattr(bounds.AbsOp, "get", counted)
        built = ex.build(kind, seed=0, width=32, batch=4)
        ex.train(built, range(1), lambda: RoundedMode.record(job_id=JOB, interval=0))
        mode = RoundedMode.record(job_id=JOB, interval=1)
        mode.signatures = built["signatures"] = []
        ex.train(built, range(1, 2), lambda: mode)
        return mode.finish(), computed, built


@pytest.mark.parametrize(("kind", "low"), [("lm", False), ("resnet", False), ("lm", True)])
def test_the_log_is_the_whole_s_log_and_replays_either_way(
    kind: str, low: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``low``: under bfloat16 autocast, whose products (bfloat16 operands, read as float32)
    are bounded from norms too."""
    log, computed, built = _record(kind, True, monkeypatch, low)
    whole_log, whole_computed, whole_built = _record(kind, False, monkeypatch, low)
    normed = {"mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward"}
    assert sum(whole_computed[p] for p in normed) > 0  # the sites exist
    assert sum(computed[p] for p in normed) == 0  # and needed no pass on absolute values
    assert any(name.endswith(":bf16") for name, _ in built["signatures"]) == low
    assert log.encode() == whole_log.encode()
    for a, b in zip(built["model"].parameters(), whole_built["model"].parameters(), strict=True):
        assert torch.equal(a, b)
    # replayed by a verifier that takes the other way, the same step bit for bit
    for given, norm_bounds in ((log, False), (whole_log, True)):
        whole = contextlib.nullcontext() if norm_bounds else normbounds.off()
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if low else contextlib.nullcontext()
        with whole, autocast:
            b2 = ex.build(kind, seed=0, width=32, batch=4)
            ex.train(b2, range(1), lambda: RoundedMode.record(job_id=JOB, interval=0))
            rep = RoundedMode.replay(given)
            ex.train(b2, range(1, 2), lambda: rep)  # noqa: B023
            rep.finish()
        for a, b in zip(built["model"].parameters(), b2["model"].parameters(), strict=True):
            assert torch.equal(a, b)


def test_a_cancelling_product_flags_much_and_computes_s_once() -> None:
    """Sums that cancel to a small value have thresholds at the cap whatever the bound: a
    quarter of the elements are flagged, past an eighth S of the whole site is computed, and
    the entries are those of the whole S."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(64, 32, generator=g)
    a = torch.cat([a, -a], dim=1)  # every row sums pairs that cancel exactly ...
    b = torch.randn(32, 48, generator=g)
    up = torch.rand(32, 48, generator=g) < 0.5
    b = torch.cat([b, torch.where(up, torch.nextafter(b, torch.tensor(np.inf)), b)])  # ... nearly
    func = aten.mm.default
    v = a.double() @ b.double()
    bound, whole = _bound(func, (a, b), {}), _bound(func, (a, b), {})
    whole.refine = False
    whole.s()
    logs = []
    for bd in (bound, whole):
        mode = RoundedMode.record(job_id=JOB, interval=0)
        mode.round_site(v.clone(), "mm.default", bd)
        logs.append(mode.finish())
    assert len(logs[0].entries) > v.numel() // 8  # thresholds at the cap
    assert bound._s is not None  # S of the whole site was computed, once
    assert logs[0].encode() == logs[1].encode()


def _edge_values(r: np.ndarray, s64: np.ndarray, bound: Any, t_bits: int, rng: Any) -> Any:
    """``v`` (float64, flat) exactly on float32 values except 16 elements placed at distance
    ``⌊t_e⌋``, ``⌊t_e⌋ + 1``, ``⌊m_e⌋``, ``⌊m_e⌋ + 1`` (4 each) from their rounding boundary, in
    units of 2^-29 gap (SPEC VI §2), with ``t_e``, ``m_e`` from ``s64``; and those elements."""
    v = r.astype(np.float64)
    # where S is large against |v| (cancelling sums), so that the norms' bound, above S, moves
    # the threshold past the elements placed one unit beyond it
    ratio = np.where(np.abs(r) > 2.0**-20, s64 / np.maximum(np.abs(r), 2.0**-20), 0.0)
    picks = rng.permutation(np.argsort(ratio)[-16:])
    gap = np.spacing(np.abs(r[picks])).astype(np.float64)
    mid = np.abs(r[picks]).astype(np.float64) + gap / 2
    t_e, m_e = thresholds(mid, s64[picks], bound.k, t_bits, bound.k_sum)
    d = np.floor(np.concatenate([t_e[:4], t_e[4:8], m_e[8:12], m_e[12:]]))
    d += np.repeat([0, 1, 0, 1], 4)
    v[picks] = np.sign(r[picks]) * (mid + d * gap * 2.0**-29)
    return v, picks


def _edge_cases() -> list[tuple[str, Any, tuple[Any, ...], int]]:
    g = torch.Generator().manual_seed(23)
    a, b = torch.randn(128, 96, generator=g), torch.randn(96, 128, generator=g)
    x, w = torch.randn(2, 32, 8, 8, generator=g).relu(), torch.randn(64, 32, 3, 3, generator=g)
    geo = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    go = torch.randn(2, 64, 8, 8, generator=g)
    bw = (go, x, w, [64], *geo, [True, True, True])
    return [
        ("mm", aten.mm.default, (a, b), 0),
        ("conv", aten.convolution.default, (x, w, None, *geo[:3], False, [0, 0], 1), 0),
        ("conv grad input", aten.convolution_backward.default, bw, 0),
        ("conv grad weight", aten.convolution_backward.default, bw, 1),
    ]


@pytest.mark.parametrize("case", _edge_cases(), ids=lambda c: c[0])
def test_elements_at_their_thresholds_are_decided_as_with_s(case: Any) -> None:
    """Every element the bound lets through is decided by its own ``S``: elements placed at
    their threshold and one unit past it are flagged exactly as ``S`` flags them, when
    recording (``t_e``) and when checking (``m_e``), and the bound never computes the whole
    ``S``."""
    _, func, args, index = case
    out = func(*[t.double() if isinstance(t, torch.Tensor) else t for t in args])
    o = (list(out) if isinstance(out, tuple | list) else [out])[index]
    bound = site_bounds(func, args, {}, out)[id(o)]
    assert bound.refine
    s64 = bound._exact(np.arange(o.numel()))  # S of every element, float64, as s_at sums it
    r = o.reshape(-1).numpy().astype(np.float32)
    mode = RoundedMode.record(job_id=JOB, interval=0)
    v, picks = _edge_values(r, s64, bound, mode.t_bits, np.random.default_rng(29))
    within_t = np.concatenate([picks[:4], picks[8:]])  # m_e < t_e: those at m_e too
    for use_m, flagged in ((False, within_t), (True, picks[8:12])):
        _, idx = mode._band_bounded(v, bound, use_m=use_m)
        _, ref = mode._band_bounded(v, Bound.given(bound.k, s64, bound.k_sum), use_m=use_m)
        assert np.array_equal(idx, ref)
        assert set(idx.tolist()) == set(flagged.tolist())
    assert bound._s is None  # decided from the norms and 16 elements' own S


@pytest.mark.parametrize("crowded", [False, True])
@pytest.mark.parametrize("with_c", [False, True])
def test_bfloat16_elements_at_their_thresholds_are_decided_as_with_s(
    with_c: bool, crowded: bool
) -> None:
    """A bfloat16 product's site (autocast) under its norm bound: elements placed at their
    bfloat16 ``t_e``, ``m_e`` and ``2·t_e`` and one unit past each are recorded (``t_e``),
    demanded (``m_e``) and accepted as entries (``2·t_e``) exactly as ``S`` decides.
    ``crowded``: an eighth of the site lies on bfloat16 boundaries, so the bound flags more
    than 1/256 of it and the whole ``S`` decides; else the flagged elements' own ``S`` does,
    and the whole ``S`` is never computed."""
    g = torch.Generator().manual_seed(37)
    a = torch.randn(128, 512, generator=g).to(torch.bfloat16)
    b = torch.randn(512, 128, generator=g).to(torch.bfloat16)
    c = torch.randn(128, 128, generator=g).to(torch.bfloat16)
    func, args = (aten.addmm.default, (c, a, b)) if with_c else (aten.mm.default, (a, b))
    o = func(*[t.double() for t in args])
    bound = site_bounds(func, args, {}, o)[id(o)]
    assert bound.refine  # bfloat16 operands take the norm bound
    if crowded:  # the S the whole-site scan takes (the operation on absolute values)
        s_ref = site_bounds(func, args, {}, o)[id(o)].s().astype(np.float64)
    else:  # the S each flagged element gets from its own terms
        s_ref = bound._exact(np.arange(o.numel()))
    r = bf16.rne(o.reshape(-1).numpy())  # v on bfloat16 values (never flagged) but the picks
    rng = np.random.default_rng(43)
    # where S is large against |v| (cancelling sums), so that the norms' bound, above S, moves
    # the threshold past the elements placed one unit beyond it
    ratio = np.where(np.abs(r) > 2.0**-20, s_ref / np.maximum(np.abs(r), 2.0**-20), 0.0)
    picks = rng.permutation(np.argsort(ratio)[-24:])

    def boundary(at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mag = np.abs(r[at]).astype(np.float64)
        gap = np.ldexp(1.0, np.frexp(mag)[1] - 1 - bf16.MANT)
        return mag + gap / 2, gap  # the boundary above each, and the bfloat16 gap

    mid, gap = boundary(picks)
    t_bits = RoundedMode.record(job_id=JOB, interval=0).t_bits
    t_e, m_e = thresholds(mid, s_ref[picks], bound.k, t_bits, bound.k_sum, mant=bf16.MANT)
    up = thresholds(mid, bound.s_upper()[picks], bound.k, t_bits, bound.k_sum, mant=bf16.MANT)
    assert (up[0][:8] > np.floor(t_e[:8]) + 1).all()
    assert (up[1][8:16] > np.floor(m_e[8:16]) + 1).all()
    level = np.concatenate([t_e[:8], m_e[8:16], 2 * t_e[16:]])
    d = np.floor(level) + np.tile(np.repeat([0, 1], 4), 3)
    v = r.astype(np.float64)
    v[picks] = np.sign(r[picks]) * (mid + d * gap * 2.0**-29)
    assert np.array_equal(bf16.distance(v[picks]), d)
    crowd = np.empty(0, dtype=np.int64)
    if crowded:
        rest = np.setdiff1d(np.flatnonzero(np.abs(r) > 2.0**-20), picks)
        crowd = np.sort(rng.choice(rest, o.numel() // 8, replace=False))
        v[crowd] = np.sign(r[crowd]) * boundary(crowd)[0]  # D = 0
    within_t = np.union1d(np.concatenate([picks[:4], picks[8:16]]), crowd)
    within_m = np.union1d(picks[8:12], crowd)
    logs = []
    for bd in (bound, Bound.given(bound.k, s_ref, bound.k_sum)):
        rec = RoundedMode.record(job_id=JOB, interval=0)
        rec._round_bf16(0, v, bd)
        logs.append(rec._rec[0][1].tolist())
    assert logs[0] == logs[1] == within_t.tolist()

    def replay(elements: np.ndarray) -> None:
        entries = [(0, int(e), 1) for e in np.sort(elements)]
        mode = RoundedMode.replay(RoundingLog(JOB, 0, rec.tau_log2, 1, rec.trace, entries))
        mode._round_bf16(0, v, bound)

    # those at m_e demanded, one unit past it not; entries within 2·t_e accepted
    replay(np.concatenate([within_m, picks[16:20]]))
    with pytest.raises(FormatError) as e:
        replay(np.setdiff1d(within_m, picks[8:9]))
    assert e.value.reason == LOG_MISSING
    with pytest.raises(FormatError) as e:
        replay(np.concatenate([within_m, picks[20:21]]))
    assert e.value.reason == LOG_INVALID
    assert (bound._s is not None) == crowded  # the whole S only where the bound flags much


def test_alpha_zero_ignores_non_finite_products() -> None:
    """``addmm`` with α = 0 ignores A·B in ATen (inf and NaN included): so does ``S``."""
    g = torch.Generator().manual_seed(31)
    c, a = torch.randn(64, 64, generator=g), torch.randn(64, 5, generator=g)
    b = torch.randn(5, 64, generator=g)
    a[2, 3], b[1, 7] = float("inf"), float("nan")
    kwargs = {"alpha": 0.0, "beta": 0.3}
    bound = _bound(aten.addmm.default, (c, a, b), kwargs)
    expect = 0.3 * c.abs().double().reshape(-1).numpy()
    assert np.isfinite(bound.s_upper()).all() and (bound.s_upper() >= expect).all()
    idx = np.array([0, 130, 135, 2000, 4095])  # row 2 and column 7 among them
    np.testing.assert_allclose(bound.s_at(idx), expect[idx], rtol=1e-15)
    assert bound._s is None
    np.testing.assert_allclose(bound.s(), expect, rtol=1e-6)  # the plain way agrees


def test_s_past_float32_range_is_computed_in_float64() -> None:
    """``S`` is finite wherever the inputs are (SPEC VI §1): a float32 sum of absolute values
    that overflows is computed again in float64, and the norm bound agrees with it."""
    g = torch.Generator().manual_seed(37)
    a, b = torch.randn(64, 4, generator=g) * 1.2e19, torch.randn(4, 64, generator=g) * 1.2e19
    whole = _bound(aten.mm.default, (a, b), {})
    s = whole.s()
    assert s.dtype == np.float64 and np.isfinite(s).all() and s.max() > 3.5e38
    bound = _bound(aten.mm.default, (a, b), {})
    assert (bound.s_upper() >= s).all()
    idx = np.arange(0, s.size, 97)
    np.testing.assert_allclose(bound.s_at(idx), s[idx], rtol=1e-12)


def test_s_whose_total_passes_float32_range_is_computed_in_float64() -> None:
    """Every element of the float32 ``S`` finite but their total past the float32 range: the
    overflow check sums ``S`` (cheaper than a mask), so the call is computed in float64 too,
    which SPEC VI §1 allows; the values are the same ``S``."""
    g = torch.Generator().manual_seed(38)
    a, b = torch.rand(64, 4, generator=g) * 2e18, torch.rand(4, 64, generator=g) * 2e18
    s32 = (a.abs() @ b.abs()).numpy()
    with np.errstate(over="ignore"):
        assert np.isfinite(s32).all() and not np.isfinite(s32.sum(dtype=np.float32))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(normbounds, "MIN_MACS", 1 << 30)  # the plain bound: S from the pass itself
        s = _bound(aten.mm.default, (a, b), {}).s()
    assert s.dtype == np.float64
    np.testing.assert_allclose(s, s32.reshape(-1), rtol=1e-6)
