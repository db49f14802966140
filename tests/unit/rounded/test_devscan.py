"""The device scan (``devscan.py``): a float32 or bfloat16 site scanned on its own device gives
the CPU scan's log, values and verdicts, bit for bit. CI has no GPU, so the device path runs
here on CPU tensors (``RoundedMode.device_scan = True``); ``bench/device_check.py`` runs it on
CUDA."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest
import torch

from dk.errors import FormatError
from dk.pol.backends import bf16, devscan, normbounds
from dk.pol.backends import examples as ex
from dk.pol.backends.bounds import Bound, thresholds
from dk.pol.backends.log import LOG_INVALID, LOG_MISSING, RoundingLog, decode_log
from dk.pol.backends.rounded import RoundedMode, boundary_distance

pytestmark = pytest.mark.usefixtures("one_torch_thread")

JOB = bytes(range(32))
SPECIAL = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 5e-324, -1e-310, 1e-40, -3e-39,
     2.0**-149 * 2.5, 2.0**-149 * 7.5 + 2.0**-190, 3.4028235677973366e38, 3.4028235e38 * 1.5,
     -3.4028235e38 * 1.0000000000001, 2.0**-125, 2.0**-126 * (1 + 2.0**-24), 1.0 + 2.0**-24,
     -(2.0**-150), -(2.0**-150) * (1 + 2.0**-20), -(2.0**-150) * (1 - 2.0**-20)],
    dtype=np.float64,
)  # fmt: skip


def _values(g: np.random.Generator, n: int, low: bool = False) -> np.ndarray:
    """float64 values, half of them within a few 2^-10 gaps of a float32 (``low``: bfloat16)
    rounding boundary, over most of the float32 range, with special values sprinkled in."""
    x = (g.standard_normal(n) * np.exp2(g.integers(-140, 120, n))).astype(np.float32)
    if low:  # bfloat16 numbers and their gaps
        x = bf16.rne(x.astype(np.float64))
        up = bf16.step(x, np.ones(n, dtype=bool))
    else:
        up = np.nextafter(x, np.float32(np.inf))
    gap = up.astype(np.float64) - x
    off = g.integers(-(2**20), 2**20, n)
    exact = g.random(n) < 0.2  # at D exactly 0 (a tie), t/2, t, t + 1, ... of the default t,
    off[exact] = g.choice(_EXACT, int(exact.sum()))
    mid = (x.astype(np.float64) + up) / 2 + off * 2.0**-29 * gap
    with np.errstate(invalid="ignore"):
        v = np.where(g.random(n) < 0.5, mid, x * (1 + g.standard_normal(n) * 2.0**-20))
    v[g.choice(n, SPECIAL.size, replace=False)] = SPECIAL
    return np.ascontiguousarray(v)


T = 1 << 19  # the default t (k = 10) in units of 2^-29 gap
# ... and at the bounded cap and its half (SPEC VI §2: T_cap = 2^26)
_EXACT = np.array([0, T // 2, T // 2 + 1, T, T + 1, 2 * T, 2 * T + 1, 1 << 25, 1 << 26])
_EXACT = np.concatenate([_EXACT, -_EXACT])


def _bound(g: np.random.Generator, v: np.ndarray) -> Bound:
    """A bound with ``S`` from well below to far above ``|v|`` (some NaN and inf)."""
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.abs(v) * np.exp2(g.uniform(-4, 40, v.size))
    s[g.choice(v.size, 6, replace=False)] = [np.nan, np.inf, 0.0, 1e300, 5e-324, np.nan]
    k = int(g.integers(2, 5000))
    if g.random() < 0.5:
        with np.errstate(over="ignore"):
            s = s.astype(np.float32)
    return Bound.given(k, s, int(g.integers(1, k)))


def _mode(device: bool, log: RoundingLog | None = None) -> RoundedMode:
    m = RoundedMode.record(job_id=JOB, interval=0) if log is None else RoundedMode.replay(log)
    m.device_scan = device
    return m


def _bits(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().reshape(-1).view(np.uint16 if t.dtype == torch.int16 else np.uint32)


def _sites(seed: int, low: bool = False) -> list[tuple[torch.Tensor, Bound | None]]:
    g = np.random.default_rng(seed)
    out: list[tuple[torch.Tensor, Bound | None]] = []
    for shape in ((3000,), (40, 70), (7, 9, 11)):
        v = _values(g, int(np.prod(shape)), low)
        out.append((torch.from_numpy(v).view(shape), None))
        out.append((torch.from_numpy(v.copy()).view(shape), _bound(g, v)))
    v = torch.from_numpy(_values(g, 60 * 50, low)).view(60, 50).t()  # not contiguous
    out.append((v, None))
    return out


def _record(
    device: bool, sites: list[tuple[torch.Tensor, Bound | None]], dtype: torch.dtype
) -> Any:
    m = _mode(device)
    outs = [m.round_site(v, "s", b, dtype=dtype) for v, b in sites]
    return m.finish(), outs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_record_equals_cpu_scan(seed: int, dtype: torch.dtype) -> None:
    """Entries (site, element, direction) and rounded bits equal the CPU scan's, on sites with
    zeros, infinities, NaNs, subnormals, values that round to infinity and bounds with NaN,
    inf and zero ``S``, at float32 and bfloat16 sites; the device path ran for plain and
    bounded sites."""
    low = dtype == torch.bfloat16
    sites = _sites(seed, low)
    before = devscan.calls.copy()
    log_d, out_d = _record(True, sites, dtype)
    ran = devscan.calls - before
    pre = "bf16 " if low else ""
    assert ran[pre + "plain"] == 4 and ran[pre + "bounded"] == 3
    log_c, out_c = _record(False, sites, dtype)
    assert len(log_c.entries) > 100  # the values do lie near boundaries
    assert log_d.entries == log_c.entries
    for a, b in zip(out_d, out_c, strict=True):
        assert a.shape == b.shape and a.stride() == b.stride()
        np.testing.assert_array_equal(_bits(a), _bits(b))


def _replay(
    device: bool, log: RoundingLog, sites: list[tuple[torch.Tensor, Bound | None]], dt: Any
) -> Any:
    m = _mode(device, log)
    try:
        return [_bits(m.round_site(v, "s", b, dtype=dt)) for v, b in sites]
    except FormatError as e:
        return e.reason


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(3))
def test_replay_and_forgeries_equal_cpu_scan(seed: int, dtype: torch.dtype) -> None:
    """An honest log replays to the same bits on both paths; a flipped direction changes them
    the same way; an entry far from a boundary, one beyond the site and a dropped entry are
    refused with the same reason on both."""
    low = dtype == torch.bfloat16
    sites = _sites(seed, low)
    log, want = _record(False, sites, dtype)
    entries = list(log.entries)
    v = sites[0][0].contiguous().numpy().reshape(-1)  # a site without a bound (threshold t)
    dist = (bf16.distance if low else boundary_distance)(v)
    at0 = [j for j, en in enumerate(entries) if en[0] == 0]
    i = min(at0, key=lambda j: int(dist[entries[j][1]]))
    site, e, up = entries[i]  # the nearest: within t/2, so its entry is required
    far = int(np.flatnonzero(dist > 2**27)[0])
    logged = {(sx, ex_) for sx, ex_, _ in entries}
    # an entry the verifier does not demand (t/2 < D <= t; a bounded site: m_e < D), dropped
    optional = [j for j in at0 if dist[entries[j][1]] > T // 2]
    vb, bound = sites[1][0].contiguous().numpy().reshape(-1), sites[1][1]
    assert bound is not None
    m_b = thresholds(vb, bound.s(), bound.k, T, bound.k_sum, mant=7 if low else 23)[1]
    dist_b = (bf16.distance if low else boundary_distance)(vb)
    optional += [j for j, (sx, ex_, _) in enumerate(entries) if sx == 1 and dist_b[ex_] > m_b[ex_]]
    assert len(optional) >= 2
    # an element the worker need not log but may (t < D <= 2t): an extra entry is accepted
    extra = next(
        int(x) for x in np.flatnonzero((dist > T) & (dist <= 2 * T)) if (0, x) not in logged
    )
    cases = {
        "honest": entries,
        "flipped": [*entries[:i], (site, e, 1 - up), *entries[i + 1 :]],
        "flip_all": [(sx, ex_, 1 - u) for sx, ex_, u in entries],
        "dropped": entries[:i] + entries[i + 1 :],
        "optional_dropped": [en for j, en in enumerate(entries) if j not in set(optional)],
        "extra": sorted([*entries, (0, extra, 1)]),
        "far": sorted({*entries, (site, far, 0)} - {(site, far, 1)}),
        "far_and_dropped": sorted(
            {*entries[:i], *entries[i + 1 :], (site, far, 0)} - {(site, far, 1)}
        ),
        "beyond": [*entries, (len(sites) - 1, 10**6, 0)],
    }
    results = {}
    for name, es in cases.items():
        forged = RoundingLog(**{**vars(log), "entries": es})
        got = _replay(True, forged, sites, dtype), _replay(False, forged, sites, dtype)
        if isinstance(got[1], str):
            assert got[0] == got[1], name
        else:
            for a, b in zip(*got, strict=True):
                np.testing.assert_array_equal(a, b)
        results[name] = got[1]
    assert all(np.array_equal(a, _bits(b)) for a, b in zip(results["honest"], want, strict=True))
    assert not all(
        np.array_equal(a, b) for a, b in zip(results["flipped"], results["honest"], strict=True)
    )
    assert results["dropped"] == LOG_MISSING
    assert results["far"] == results["far_and_dropped"] == results["beyond"] == LOG_INVALID
    for name in ("optional_dropped", "extra", "flip_all"):
        assert not isinstance(results[name], str), name  # accepted


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["resnet", "lm"])
def test_training_interval_same_log_and_state(kind: str, precision: str) -> None:
    """Whole intervals of the examples (bf16: under the CPU's bfloat16 autocast): the device
    path records the CPU path's log and state, and replays the CPU path's log to its state."""
    cfg = {"resnet": {"width": 8, "batch": 8}, "lm": {"width": 32, "batch": 4}}[kind]
    low = precision == "bf16"

    def run(device: bool, log: RoundingLog | None = None) -> tuple[bytes, dict[str, np.ndarray]]:
        b = ex.build(kind, seed=5, **cfg)
        m = _mode(device, None if log is None else log)
        cast = torch.autocast("cpu", dtype=torch.bfloat16) if low else contextlib.nullcontext()
        with cast:
            ex.train(b, range(3), lambda: m)
        return m.finish().encode(), ex.state_tensors(b["model"], b["opt"])

    with normbounds.off():  # as on a GPU: every S from the operation on absolute values
        before = devscan.calls.copy()
        log_d, st_d = run(True)
        ran = devscan.calls - before
        assert ran["bounded"] > 0 and (not low or ran["bf16 bounded"] > 0)
        log_c, st_c = run(False)
        _, st_r = run(True, decode_log(log_c))
    assert log_d == log_c
    for k in st_c:
        want = st_c[k].reshape(-1).view(np.uint8)
        np.testing.assert_array_equal(st_d[k].reshape(-1).view(np.uint8), want)
        np.testing.assert_array_equal(st_r[k].reshape(-1).view(np.uint8), want)


@pytest.mark.parametrize("low", [False, True])
def test_candidates_are_few(low: bool) -> None:
    """On values with no bias toward boundaries the candidates are about the ``2t/2^29`` share
    of elements the bit test admits (plus tiny values), not the whole site."""
    g = np.random.default_rng(11)
    v = torch.from_numpy(g.standard_normal(1 << 18) * np.exp2(g.integers(-60, 60, 1 << 18)))
    n = devscan.candidates(v, T, bf16=low).numel()
    assert 0 < n < 4 * (2 * T / 2**29) * v.numel()
    cap = devscan.candidates(v, 1 << 26, bf16=low).numel()  # the bit test at the cap alone
    nb = devscan.candidates(v, 1 << 26, v.abs() * 1024, (64, 64), (2.5, 2.0), bf16=low).numel()
    assert nb < cap // 100 and (low or nb > 0)
