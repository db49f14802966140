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
from dk.pol.backends.log import LOG_INVALID, LOG_MISSING, RoundingLog
from dk.pol.backends.rounded import RoundedMode

pytestmark = pytest.mark.usefixtures("one_torch_thread")

JOB = bytes(range(32))


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
