"""bfloat16 rounding sites under autocast (SPEC VI §2): direct rounding from float64, the
boundary distance in bfloat16 gaps, neighbours, and what a verifier refuses."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from dk.errors import BackendUnavailable, FormatError
from dk.pol.backends import bf16
from dk.pol.backends import examples as ex
from dk.pol.backends.bounds import C_MISSING, C_RECORD, Bound, bound_cap, thresholds
from dk.pol.backends.log import LOG_INVALID, LOG_MISSING, RoundingLog
from dk.pol.backends.rounded import RoundedMode

pytestmark = pytest.mark.usefixtures("one_torch_thread")

JOB = bytes(range(32))
D_MAX = (1 << 28) - 1  # the largest D of a value that is not representable


def _exponent(f: Fraction) -> int:
    e = f.numerator.bit_length() - f.denominator.bit_length()
    while Fraction(2) ** e > f:
        e -= 1
    while Fraction(2) ** (e + 1) <= f:
        e += 1
    return max(e, -126)  # below 2^-126 the gap is the subnormal spacing 2^-133


def _ref_rne(x: float) -> float:
    """Round-to-nearest-even to bfloat16 in exact rational arithmetic."""
    if x == 0:
        return 0.0
    f, sign = abs(Fraction(x)), -1 if x < 0 else 1
    gap = Fraction(2) ** (_exponent(f) - 7)
    q, rem = divmod(f, gap)
    q += 1 if rem * 2 > gap or (rem * 2 == gap and q % 2 == 1) else 0
    val = q * gap
    return sign * math.inf if val >= Fraction(2) ** 128 else float(sign * val)


def _ref_distance(x: float) -> int:
    f = abs(Fraction(x))
    if f == 0 or math.isinf(_ref_rne(x)):
        return 1 << 28
    gap = Fraction(2) ** (_exponent(f) - 7)
    p = (f - (f // gap) * gap) / gap
    return math.floor(abs(p - Fraction(1, 2)) * 2**29)


def _values() -> np.ndarray:
    g = np.random.default_rng(1128)
    wide = g.standard_normal(3000) * np.exp(g.uniform(-95, 95, 3000))
    grid = torch.randn(1000, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    lo = grid.float().numpy()
    hi = bf16.step(lo, np.ones(lo.size, dtype=bool))
    mid = (lo.astype(np.float64) + hi) / 2  # exact midpoints between bfloat16 neighbours
    edge = [3.38e38, 3.3895e38, 3.4e38, 1e-39, 5e-41, -1e-45, 2.0**-134, 3 * 2.0**-134, -0.0]
    near = [np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)]
    return np.concatenate([wide, mid, *near, edge])


def test_rounding_and_distance_match_exact_arithmetic() -> None:
    v = _values()
    got = bf16.rne(v)
    want = np.array([_ref_rne(x) for x in v], dtype=np.float32) + np.float32(0.0)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # ties, subnormals, inf
    assert np.array_equal(bf16.distance(v), [_ref_distance(x) for x in v])
    # direct rounding differs from torch's float64 -> float32 -> bfloat16 (double rounding)
    via32 = torch.from_numpy(v).float().to(torch.bfloat16).float().numpy()
    assert np.count_nonzero(via32 != got) > 0


def test_neighbours_bracket_the_value() -> None:
    v = _values()
    r = bf16.rne(v)
    fin = np.isfinite(r)
    up = np.random.default_rng(2).random(v.size) < 0.5
    nb = bf16.neighbour(r, v, up)[fin].astype(np.float64)
    assert np.all(np.where(up[fin], nb >= v[fin], nb <= v[fin]))
    other = bf16.neighbour(r, v, ~up)[fin]
    assert np.all((nb == r[fin]) | (other == r[fin]))  # the nearest is one of the two
    # adjacent: the neighbour is the nearest itself or one bfloat16 step from it
    stepped = bf16.step(r[fin], up[fin]) + np.float32(0.0)
    assert np.all((nb == r[fin]) | (nb == stepped))


def _bf16_at_threshold(
    rng: np.random.Generator, s: np.ndarray | None, k: tuple[int, int], use_m: bool, t_bits: int
) -> np.ndarray:
    """Values whose bfloat16 ``D`` is ``floor(threshold) + {-1, 0, 1}`` (``S = s``, or the
    unbounded ``t``), on either side of a boundary, with random bits below ``D``'s unit; ``S``
    up to ``2^51`` puts thresholds at the cap."""
    n = 30_000
    e = rng.integers(-20, 20, n)
    hi = rng.integers(0, 1 << 7, n).astype(np.uint64)
    sign = rng.choice(np.array([0, 1 << 63], dtype=np.uint64), n)
    base = ((e + 1023).astype(np.uint64) << np.uint64(52)) | (hi << np.uint64(45))
    mid = (base | np.uint64(1 << 44)).view(np.float64)  # a boundary, in the binade of v
    if s is None:
        t_e = np.full(n, float(t_bits))
        m_e = t_e / 2
    else:
        t_e, m_e = thresholds(mid, s, k[0], t_bits, k[1], mant=bf16.MANT)
    d = np.clip(np.floor(m_e if use_m else t_e).astype(np.int64) + rng.integers(-1, 2, n), 0, D_MAX)
    low = (1 << 44) + rng.choice([-1, 1], n) * (d << 16) + rng.integers(0, 1 << 16, n)
    return ((base | low.astype(np.uint64)) | sign).view(np.float64)


@pytest.mark.parametrize("t_bits", [1 << 19, (1 << 23)])
@pytest.mark.parametrize("use_m", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_fused_scan_equals_the_reference(seed: int, use_m: bool, t_bits: int) -> None:
    """``bf16.scan`` (one Numba pass) gives ``rne``'s bits and the elements ``distance`` and
    ``thresholds(mant=7)`` select, at the thresholds; odd seeds bound no ``S`` (the unbounded
    ``t``), seeds 2 and 3 add specials (zeros, NaN, infinities, overflow, tiny values) and
    ``S`` of NaN, infinity and 0."""
    rng = np.random.default_rng(seed)
    k = (int(rng.integers(1, 4096)), 0)
    k = (k[0], int(rng.integers(1, k[0] + 1)))
    s = None if seed % 2 else np.exp2(rng.uniform(-30, 50, 30_000)) * rng.uniform(1, 2, 30_000)
    v = _bf16_at_threshold(rng, s, k, use_m, t_bits)
    if seed >= 2:
        pick = rng.choice(v.size, size=v.size // 4, replace=False)
        specials = [0.0, -0.0, np.nan, np.inf, -np.inf, 3.4e38, -3.3895e38, 1e39, 2.0**-126,
                    -(2.0**-130), 3 * 2.0**-134, 5e-324, 1.5]  # fmt: skip
        nans = np.array([0xFFF8000000000000, 0x7FF0000000000001], dtype=np.uint64)  # -NaN, sNaN
        v[pick] = rng.choice(np.concatenate([specials, nans.view(np.float64)]), pick.size)
        if s is not None:
            s_pick = rng.choice(v.size, size=v.size // 10, replace=False)
            s[s_pick] = rng.choice(np.array([np.nan, np.inf, 0.0, 1e300]), s_pick.size)
    cap = bound_cap(t_bits)
    r, idx, tiny = bf16.scan(v, s, k, t_bits, (C_RECORD, C_MISSING, cap), use_m)
    d = bf16.distance(v)
    if s is None:
        t_e = np.full(v.size, float(t_bits))
        m_e = t_e / 2
    else:
        t_e, m_e = thresholds(v, s, k[0], t_bits, k[1], mant=bf16.MANT)
    is_tiny = (v != 0) & (np.abs(v) < 2.0**-125)
    want = np.flatnonzero((d <= (m_e if use_m else t_e)) & ~is_tiny)  # tiny: the caller's
    assert want.size > 1000  # the threshold cases are in the test
    if s is not None:  # and the cap's
        assert np.count_nonzero((m_e if use_m else t_e) == (cap / 2 if use_m else cap)) > 1000
    np.testing.assert_array_equal(idx, want)
    np.testing.assert_array_equal(r.view(np.uint32), bf16.rne(v).view(np.uint32))
    assert tiny == bool(is_tiny.any()) == (seed >= 2)


def test_the_scan_refuses_an_s_of_another_size() -> None:
    """Numba reads ``S`` by the values' index without bounds checks: the size is checked."""
    with pytest.raises(ValueError, match="3 values of S for 4 values"):
        bf16.scan(np.ones(4), np.ones(3), (4, 4), 1 << 19, (C_RECORD, C_MISSING, 1 << 26), False)


@pytest.mark.parametrize("bounded", [True, False])
def test_a_site_logs_what_the_reference_selects_tiny_values_included(bounded: bool) -> None:
    """``_round_bf16`` records exactly the elements with ``distance <= t_e`` (the NumPy
    reference over every element; the kernel leaves tiny ones to it), and a replay that lacks
    an entry for a tiny element within ``m_e`` refuses it."""
    rng = np.random.default_rng(7)
    g = np.arange(1, 2001, dtype=np.float64)
    rel = rng.uniform(-1, 1, g.size) * np.exp2(rng.uniform(-45, -10, g.size))
    tiny = (2 * g + 1) * 2.0**-134 * (1 + rel)  # near subnormal bfloat16 midpoints
    v = np.concatenate([_values(), tiny * rng.choice([-1.0, 1.0], g.size)])
    s = np.abs(v) * rng.uniform(0, 4, v.size) + 2.0**-140 if bounded else None
    if s is not None:  # tiny values' thresholds from 2 up to ~2^15 units
        s[-g.size :] = np.exp2(rng.uniform(-118, -100, g.size))
    k = (64, 32)
    bound = Bound.given(k[0], s, k[1]) if bounded else None
    rec = RoundedMode.record(job_id=JOB, interval=0)
    r = rec._round_bf16(0, v.copy(), bound)
    np.testing.assert_array_equal(r.view(np.uint32), bf16.rne(v).view(np.uint32))
    if bounded:
        t_e, m_e = thresholds(v, s, k[0], rec.t_bits, k[1], mant=bf16.MANT)
    else:
        t_e, m_e = np.full(v.size, float(rec.t_bits)), np.full(v.size, rec.t_bits / 2)
    d = bf16.distance(v)
    want = np.flatnonzero(d <= t_e)
    got = rec._rec[0][1] if rec._rec else np.empty(0, np.int64)
    np.testing.assert_array_equal(got, want)
    is_tiny = (v != 0) & (np.abs(v) < 2.0**-125)
    need_tiny = np.flatnonzero(is_tiny & (d <= m_e))
    assert 100 < need_tiny.size < g.size - 100  # tiny values decide entries, both ways
    entries = [(0, int(e), int(u)) for e, u in zip(want, rec._rec[0][2], strict=True)]

    def replay(kept: list[tuple[int, int, int]]) -> np.ndarray:
        mode = RoundedMode.replay(RoundingLog(JOB, 0, rec.tau_log2, 1, rec.trace, kept))
        return mode._round_bf16(0, v.copy(), bound)

    np.testing.assert_array_equal(replay(entries), r)  # the recorded sides: the same values
    drop = int(need_tiny[0])
    with pytest.raises(FormatError) as e:
        replay([x for x in entries if x[1] != drop])
    assert e.value.reason == LOG_MISSING
    # an entry of a tiny element within t_e but not m_e is the worker's choice: no demand
    optional = np.flatnonzero(is_tiny & (d > m_e) & (d <= t_e))
    assert optional.size
    replay([x for x in entries if x[1] not in set(optional.tolist())])


def _autocast_run(log: RoundingLog | None) -> tuple[RoundedMode, dict]:
    b = ex.build("lm", seed=0, width=16, batch=2)
    mode = RoundedMode.record(job_id=JOB, interval=0) if log is None else RoundedMode.replay(log)
    mode.signatures = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ex.train(b, range(1), lambda: mode)
    return mode, b


def test_autocast_run_has_bfloat16_sites_and_replays() -> None:
    rec, b = _autocast_run(None)
    log = rec.finish()
    assert rec.signatures is not None
    bsites = [i for i, (n, _) in enumerate(rec.signatures) if n.endswith(":bf16")]
    assert bsites and any(s in bsites for s, _, _ in log.entries)  # bf16 elements logged
    rep, b2 = _autocast_run(log)
    rep.finish()
    for k, v in ex.state_tensors(b["model"], b["opt"]).items():
        assert np.array_equal(v, ex.state_tensors(b2["model"], b2["opt"])[k]), k


def test_bfloat16_forgeries_are_refused() -> None:
    """A dropped bfloat16 entry near its boundary is missing; an entry on an element far from
    a bfloat16 boundary (a worker steering training) is invalid."""
    rec, _ = _autocast_run(None)
    log = rec.finish()
    assert rec.signatures is not None
    bsites = {i for i, (n, _) in enumerate(rec.signatures) if n.endswith(":bf16")}
    dist = rec.distances()
    j = next(i for i, (s, _, _) in enumerate(log.entries) if s in bsites and dist[i] < 1 << 17)
    site = log.entries[j][0]
    logged = {e for s, e, _ in log.entries if s == site}
    free = next(e for e in range(10**6) if e not in logged)

    def reason(entries: list[tuple[int, int, int]]) -> str:
        forged = RoundingLog(log.job_id, 0, log.tau_log2, log.sites, log.trace, sorted(entries))
        with pytest.raises(FormatError) as e:
            _autocast_run(forged)[0].finish()
        return str(e.value.reason)

    assert reason(log.entries[:j] + log.entries[j + 1 :]) == LOG_MISSING
    assert reason([*log.entries, (site, free, 1)]) == LOG_INVALID


def test_a_rounded_bf16_job_replays_on_its_own_device_type_only() -> None:
    from dk.pol import default_job
    from dk.pol.torch_adapter import replay_device

    job = default_job(arch="mlp", steps=4, interval=2, pol={"backend": "rounded"})
    cuda = job.with_updates(train={"precision": "bf16", "device": "cuda"})
    with pytest.raises(BackendUnavailable, match="replays bit for bit on cuda only"):
        replay_device(cuda, "cpu")
    assert replay_device(job.with_updates(train={"precision": "bf16"})).type == "cpu"
    assert replay_device(job.with_updates(train={"device": "cuda"}), "cpu").type == "cpu"
    exact_torch = job.with_updates(pol={"backend": "torch"}, train={"device": "cuda"})
    with pytest.raises(BackendUnavailable, match="torch's kernels differ"):
        replay_device(exact_torch, "cpu")  # same-machine only: inconclusive, not a reject


def test_a_bfloat16_dtype_argument_gives_a_bfloat16_site() -> None:
    """``sum(float32, dtype=bfloat16)``: torch's dtype, a bfloat16 site (SPEC VI §1)."""
    x = torch.randn(64, generator=torch.Generator().manual_seed(3))
    mode = RoundedMode.record(job_id=JOB, interval=0)
    mode.signatures = []
    with mode:
        s = torch.sum(x, dtype=torch.bfloat16)
    assert s.dtype == torch.bfloat16 and mode.signatures[-1][0].endswith(":bf16")
    assert s.float().item() == bf16.rne(np.array([x.double().sum().item()]))[0]


def test_an_operation_without_a_meta_kernel_is_named_at_record_time() -> None:
    """A bfloat16 site's dtype comes from torch's meta kernel; without one, the operation is
    unsupported (one line naming it), not a crash or a guessed dtype."""
    from dk.pol.backends.rounded import UnsupportedOp, _meta_dtypes

    def no_meta(*args: object, **kwargs: object) -> None:
        raise NotImplementedError("no meta kernel")

    with pytest.raises(UnsupportedOp, match="no meta kernel"):
        _meta_dtypes(no_meta, (torch.ones(2, dtype=torch.bfloat16),), {})
    dts = _meta_dtypes(torch.ops.aten.mm.default, (torch.ones(2, 2, dtype=torch.bfloat16),) * 2, {})
    assert dts == [torch.bfloat16]
