"""Generate ``vectors/rounding/``: rounding-log bytes and replays of one site (SPEC VI).

Deterministic (fixed values, no clock); ``python -m vectors.gen rounding``. Checked by
:mod:`dk.vectors.rounding`.

* ``log.json``: logs with their canonical bytes and digests; malformed
  blobs (``ROUNDING_LOG_MALFORMED``) and logs bound to another interval or τ
  (``ROUNDING_LOG_MISMATCH``).
* ``replay.json``: one float64 site (an ``mm.default`` output of 16 values placed at chosen
  distances from float32 boundaries) and a log to follow: the float32 bits to expect, or the
  reason the verifier rejects the log; then a bounded site (SPEC VI §2: its ``bound`` gives
  ``K`` and ``S``, so each element has its own thresholds ``t_e`` and ``m_e``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dk.pol.backends.log import FIXED_HEADER_SIZE, RoundingLog, _varint, log_digest
from dk.vectors import write_cases

JOB = bytes(range(32))
K = 12


def _log(**kw: Any) -> RoundingLog:
    base: dict[str, Any] = {"job_id": JOB, "interval": 0, "tau_log2": K, "sites": 4,
                            "trace": bytes([7]) * 32, "entries": []}  # fmt: skip
    return RoundingLog(**{**base, **kw})


def _as_dict(log: RoundingLog) -> dict[str, Any]:
    return {"job_id": log.job_id.hex(), "interval": log.interval, "tau_log2": log.tau_log2,
            "sites": log.sites, "trace": log.trace.hex(),
            "entries": [list(e) for e in log.entries]}  # fmt: skip


def _log_cases() -> list[dict[str, Any]]:
    valid = [
        ("empty log", _log(sites=0)),
        ("one entry", _log(entries=[(2, 5, 1)])),
        ("deltas within a site and across sites",
         _log(entries=[(0, 0, 0), (0, 1, 1), (0, 300, 0), (3, 7, 1)])),
        ("element needing a 7-byte varint", _log(entries=[(1, 2**47, 1)])),
        ("long gaps in one site (Rice parameter 19)",
         _log(entries=[(2, 5, 1), (2, 600_006, 0), (2, 1_300_000, 1)])),
        ("interval 9, tau 2^-20", _log(interval=9, tau_log2=20, sites=1, entries=[(0, 0, 1)])),
        ("gaps 1 and 2 (their mean 1.5 rounds down: Rice parameter 0)",
         _log(entries=[(0, 0, 1), (0, 2, 0), (0, 5, 1)])),
        ("sites = 2^40 (the limit), an entry at the last site",
         _log(sites=2**40, entries=[(2**40 - 1, 0, 1)])),
    ]  # fmt: skip
    cases: list[dict[str, Any]] = []
    for comment, log in valid:
        blob = log.encode()
        cases.append({"comment": comment, "result": "valid", "log": _as_dict(log),
                      "blob": blob.hex(), "digest": log_digest(blob).hex()})  # fmt: skip
    good = _log(entries=[(0, 0, 0), (0, 1, 1), (3, 7, 1)]).encode()
    h = FIXED_HEADER_SIZE + 3  # interval 0, sites 4 and count 3 take one byte each
    # good[h:]: group of site 0 (delta 0, size 2·1 + d_1 0, e_1 0, r 0, bits 1 0 then padding:
    # 0x80), group of site 3 (delta 3, size 2·0 + d_1 1, e_1 7)
    assert good[h:] == bytes([0, 2, 0, 0, 0x80, 3, 1, 7])

    def head(interval: int = 0, sites: int = 4, count: int = 3) -> bytes:
        return good[:FIXED_HEADER_SIZE] + _varint(interval) + _varint(sites) + _varint(count)

    bad = [
        ("bad magic", b"DKRX" + good[4:]),
        ("version 1 (the varint entries of the draft)", good[:4] + b"\x01" + good[5:]),
        ("version 2 (every threshold the job's t)", good[:4] + b"\x02" + good[5:]),
        ("version 3 (convolutions summed in one block)", good[:4] + b"\x03" + good[5:]),
        ("version 4 (fused attention, torch's sqrt)", good[:4] + b"\x04" + good[5:]),
        ("version 5 (u64 header fields, r and bits in every group)",
         good[:4] + b"\x05" + good[5:]),
        ("precision 2", good[:5] + b"\x02" + good[6:]),
        ("tau_log2 5", good[:6] + b"\x05" + good[7:]),
        ("tau_log2 25", good[:6] + b"\x19" + good[7:]),
        ("reserved byte set", good[:7] + b"\x01" + good[8:]),
        ("short header", good[: h - 1]),
        ("trailing byte", good + b"\x00"),
        ("truncated entry", good[:-1]),
        ("count above the entries present", head(count=4) + good[h:]),
        ("count above MAX_ENTRIES", head(count=2**24 + 1) + good[h:]),
        ("sites above 2^40", head(sites=2**40 + 1) + good[h:]),
        ("site 3 not below sites = 3", head(sites=3) + good[h:]),
        ("interval 2^63", head(interval=2**63) + good[h:]),
        ("non-minimal varint (0x80 0x00)", good[:h] + b"\x80\x00" + good[h + 1 :]),
        ("varint of 11 bytes", good[:h] + b"\xff" * 10 + b"\x01" + good[h + 1 :]),
        ("non-minimal varint in the header (count 0x83 0x00)",
         good[: h - 1] + b"\x83\x00" + good[h:]),
        ("padding bit set", good[:h + 4] + b"\x81" + good[h + 5 :]),
        ("Rice parameter 1 where the gaps give 0", good[:h + 3] + b"\x01" + good[h + 4 :]),
        ("Rice parameter 48", good[:h + 3] + b"\x30" + good[h + 4 :]),
        ("element 2^48 (a group's first)", head(count=1) + b"\x00\x00"
         + bytes([0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40])),
        ("group of two entries in a log of count 1", head(count=1) + bytes([0, 2, 0, 0, 0x80])),
        ("element 2^51", head(count=1) + b"\x00\x00"
         + bytes([0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x04])),
        ("gaps summing past 2^48", head(count=2) + b"\x00\x02"
         + bytes([0xFF] * 6 + [0x3F]) + b"\x00\x00"),
        ("two groups of one site (site delta 0 after the first group)",
         head(count=2) + bytes([0, 0, 0] * 2)),
        ("group larger than the entries left", good[:h + 1] + b"\x06" + good[h + 2 :]),
        ("group of one entry followed by an r byte", head(count=1) + bytes([0, 0, 0, 0])),
    ]  # fmt: skip
    for comment, blob in bad:
        cases.append({"comment": comment, "result": "invalid", "blob": blob.hex(),
                      "expected_reason": "ROUNDING_LOG_MALFORMED"})  # fmt: skip
    for comment, expect in [
        ("log of interval 0 presented for interval 1", {"interval": 1}),
        ("log of another job", {"job_id": bytes(32).hex()}),
        ("log with tau 2^-12 for a job with tau 2^-16", {"tau_log2": 16}),
    ]:
        binding = {"job_id": JOB.hex(), "interval": 0, "tau_log2": K, **expect}
        cases.append({"comment": comment, "result": "invalid", "blob": good.hex(),
                      "expect": binding, "expected_reason": "ROUNDING_LOG_MISMATCH"})  # fmt: skip
    return cases


# fractions of the float32 gap above each base value (t = 2^17 units of 2^-29 gap for k = 12)
_FRACS = [0.5, 0.5 + 2.0**-14, 0.5 - 2.0**-12.5, 0.5 + 2.0**-11.5, 0.25, 0.0, 0.75, 0.5]


def site_values() -> np.ndarray:
    """16 float64 values at chosen distances from float32 boundaries (normal and subnormal)."""
    out = []
    for base in (1.0, -3.0):
        b = np.float32(base)
        gap = float(np.spacing(np.abs(b)))
        out += [np.sign(base) * (abs(float(b)) + f * gap) for f in _FRACS[:6]]
    out += [2.0**-149 * 0.5, 2.0**-149 * 3.5, 2.0**-149 * 1.25, 0.0]  # subnormal tie, tie, far, 0
    return np.array(out, dtype=np.float64)


def _replay_cases() -> list[dict[str, Any]]:
    import torch

    from dk.pol.backends.rounded import RoundedMode

    v = site_values()
    mode = RoundedMode.record(job_id=JOB, interval=0, tau_log2=K)
    mode.round_site(torch.from_numpy(v.copy()), "mm.default")
    honest = mode.finish()
    cases: list[dict[str, Any]] = []

    def add(comment: str, log: RoundingLog, reason: str | None = None) -> None:
        case: dict[str, Any] = {"comment": comment, "values": v.astype("<f8").tobytes().hex(),
                                "name": "mm.default", "log": log.encode().hex()}  # fmt: skip
        if reason is None:
            replay = RoundedMode.replay(log)
            r = replay.round_site(torch.from_numpy(v.copy()), "mm.default").numpy()
            replay.finish()
            case.update(result="valid", rounded=r.astype("<f4").tobytes().hex())
        else:
            case.update(result="invalid", expected_reason=reason)
        cases.append(case)

    e = honest.entries
    add(f"honest log ({len(e)} entries: ties and near-ties, normal and subnormal)", honest)
    flipped = [(s, i, 1 - d) if i == 1 else (s, i, d) for s, i, d in e]
    add("worker took the other side at an element within 2τ (allowed; one ulp)",
        RoundingLog(**{**vars(honest), "entries": flipped}))  # fmt: skip
    near_2t = [(0, 3, 0), *e] if (0, 3) not in {x[:2] for x in e} else e
    add("entry for an element between τ and 2τ of its boundary (allowed)",
        RoundingLog(**{**vars(honest), "entries": sorted(near_2t)}))  # fmt: skip
    add(
        "entry for an element a quarter gap from its boundary",
        RoundingLog(**{**vars(honest), "entries": sorted([*e, (0, 4, 1)])}),
        "ROUNDING_LOG_INVALID",
    )
    add(
        "entry for an exactly representable value",
        RoundingLog(**{**vars(honest), "entries": sorted([*e, (0, 5, 1)])}),
        "ROUNDING_LOG_INVALID",
    )
    add(
        "entry beyond the site's 16 elements",
        RoundingLog(**{**vars(honest), "entries": [*e, (0, 16, 1)]}),
        "ROUNDING_LOG_INVALID",
    )
    add("tie entry dropped", RoundingLog(**{**vars(honest), "entries": e[1:]}),
        "ROUNDING_LOG_MISSING")  # fmt: skip
    add(
        "log claims two sites, the verifier ran one",
        RoundingLog(**{**vars(honest), "sites": 2}),
        "ROUNDING_TRACE_MISMATCH",
    )
    add("log trace of another program", RoundingLog(**{**vars(honest), "trace": bytes(32)}),
        "ROUNDING_TRACE_MISMATCH")  # fmt: skip
    return cases


def bf16_site_values() -> np.ndarray:
    """12 float64 values at chosen distances from bfloat16 boundaries: ties, near-ties (whose
    float32 rounding is the tie: direct rounding differs from rounding through float32), a
    quarter gap, an exact value, a subnormal tie and zero."""
    out = []
    for base in (1.0, -3.0):
        gap = 2.0**-7 * (2.0 if abs(base) >= 2 else 1.0)
        out += [np.sign(base) * (abs(base) + f * gap) for f in (0.5, 0.5 + 2.0**-30, 0.25, 0.0)]
    out += [np.nextafter(1.0 + 2.0**-8, 2.0), 2.0**-133 * 0.5, 2.0**-133 * 2.5, 0.0]
    return np.array(out, dtype=np.float64)


def _bf16_replay_cases() -> list[dict[str, Any]]:
    """A bfloat16 site (SPEC VI §2, bfloat16 sites): the same rules in bfloat16 gaps."""
    import torch

    from dk.pol.backends.rounded import RoundedMode

    v, name = bf16_site_values(), "mm.default"
    mode = RoundedMode.record(job_id=JOB, interval=0, tau_log2=K)
    mode.round_site(torch.from_numpy(v.copy()), name, dtype=torch.bfloat16)
    honest = mode.finish()
    e = honest.entries
    cases: list[dict[str, Any]] = []

    def add(comment: str, log: RoundingLog, reason: str | None = None) -> None:
        case: dict[str, Any] = {"comment": comment, "values": v.astype("<f8").tobytes().hex(),
                                "name": name, "dtype": "bfloat16",
                                "log": log.encode().hex()}  # fmt: skip
        if reason is None:
            replay = RoundedMode.replay(log)
            r = replay.round_site(torch.from_numpy(v.copy()), name, dtype=torch.bfloat16)
            replay.finish()
            case.update(result="valid", rounded=r.float().numpy().astype("<f4").tobytes().hex())
        else:
            case.update(result="invalid", expected_reason=reason)
        cases.append(case)

    add(f"bfloat16 site, honest log ({len(e)} entries: ties, near-ties, subnormal)", honest)
    add("bfloat16 site: entry for an element a quarter bfloat16 gap from its boundary",
        RoundingLog(**{**vars(honest), "entries": sorted([*e, (0, 2, 1)])}),
        "ROUNDING_LOG_INVALID")  # fmt: skip
    add("bfloat16 site: entry for an exactly representable value",
        RoundingLog(**{**vars(honest), "entries": sorted([*e, (0, 3, 0)])}),
        "ROUNDING_LOG_INVALID")  # fmt: skip
    add("bfloat16 site: tie entry dropped", RoundingLog(**{**vars(honest), "entries": e[1:]}),
        "ROUNDING_LOG_MISSING")  # fmt: skip
    add("bfloat16 site replayed as a float32 site (other trace)",
        RoundingLog(**{**vars(honest), "trace": _float32_trace(v, name)}),
        "ROUNDING_TRACE_MISMATCH")  # fmt: skip
    return cases


def _float32_trace(v: np.ndarray, name: str) -> bytes:
    import torch

    from dk.pol.backends.rounded import RoundedMode

    mode = RoundedMode.record(job_id=JOB, interval=0, tau_log2=K)
    mode.round_site(torch.from_numpy(v.copy()), name)
    return mode.finish().trace


# A bounded site (SPEC VI §2): 64 terms, S = 2 at values near 1, so beta = 64 units of 2^-29
# gap, t_e = 2.5·64 + 2 = 162 (an entry accepted up to 324) and m_e = 0.4·64 = 25.6, against
# the job's t = 2^17 (k = 12). Distances D of the 8 values from their float32 midpoint:
_BOUND_K, _BOUND_S = 64, 2.0
_BOUND_D = [0, 20, 100, 300, 1000, 5000, 60_000, 1 << 28]


def bounded_site_values() -> np.ndarray:
    """8 float64 values in [1, 2) at the distances ``_BOUND_D`` above float32 midpoints."""
    return np.array([1.0 + ((1 << 28) + d) * 2.0**-52 if d < 1 << 28 else 1.5 for d in _BOUND_D])


Add = Callable[..., None]


def _site_cases(
    name: str,
    k: int,
    k_sum: int | None,
    s_value: float = _BOUND_S,
    values: np.ndarray | None = None,
    bfloat16: bool = False,
) -> tuple[list[tuple[int, int, int]], Add, list[dict[str, Any]]]:
    """The honest entries of a bounded site of ``values`` (default ``bounded_site_values``;
    ``S = s_value``, ``k`` terms, ``k_sum`` blocked; ``bfloat16``: a bfloat16 site), a function
    adding a case with other entries, and the case list."""
    import torch

    from dk.pol.backends.bounds import Bound
    from dk.pol.backends.rounded import RoundedMode

    v = bounded_site_values() if values is None else values
    s = np.full(v.size, s_value)
    dtype = torch.bfloat16 if bfloat16 else torch.float32
    bound: dict[str, Any] = {"k": k, "s": s.astype("<f8").tobytes().hex()}
    if k_sum is not None:
        bound = {"k": k, "k_sum": k_sum, "s": bound["s"]}
    mode = RoundedMode.record(job_id=JOB, interval=0, tau_log2=K)
    mode.round_site(torch.from_numpy(v.copy()), name, Bound.given(k, s, k_sum), dtype=dtype)
    honest = mode.finish()
    cases: list[dict[str, Any]] = []

    def add(comment: str, entries: list[tuple[int, int, int]], reason: str | None = None) -> None:
        log = RoundingLog(**{**vars(honest), "entries": sorted(entries)})
        case: dict[str, Any] = {"comment": comment, "values": v.astype("<f8").tobytes().hex(),
                                "name": name, "bound": bound,
                                "log": log.encode().hex()}  # fmt: skip
        if bfloat16:
            case["dtype"] = "bfloat16"
        if reason is None:
            replay = RoundedMode.replay(log)
            r = replay.round_site(
                torch.from_numpy(v.copy()), name, Bound.given(k, s, k_sum), dtype=dtype
            )
            replay.finish()
            case.update(result="valid", rounded=r.float().numpy().astype("<f4").tobytes().hex())
        else:
            case.update(result="invalid", expected_reason=reason)
        cases.append(case)

    return honest.entries, add, cases


def _bounded_replay_cases() -> list[dict[str, Any]]:
    e, add, cases = _site_cases("mm.default", _BOUND_K, None)
    assert [x[1] for x in e] == [0, 1, 2]  # D = 0, 20, 100: within t_e = 162
    add("bounded site: honest log (elements within t_e = 162 of a midpoint)", e)
    add("bounded site: entry between t_e and 2·t_e (allowed)", [*e, (0, 3, 1)])
    add("bounded site: the logged direction of an element within t_e reversed (allowed)",
        [(a, b, 1 - d) if b == 2 else (a, b, d) for a, b, d in e])  # fmt: skip
    add("bounded site: entry far outside the element's bound (D = 1000 > 2·t_e, though < t)",
        [*e, (0, 4, 1)], "ROUNDING_LOG_INVALID")  # fmt: skip
    add("bounded site: entry at D = 60000, within the job's t but not the bound",
        [*e, (0, 6, 0)], "ROUNDING_LOG_INVALID")  # fmt: skip
    add("bounded site: entry within m_e = 25.6 dropped (D = 20)",
        [x for x in e if x[1] != 1], "ROUNDING_LOG_MISSING")  # fmt: skip
    add("bounded site: entry between m_e and t_e dropped (D = 100; not demanded)",
        [x for x in e if x[1] != 2])  # fmt: skip
    return cases + _blocked_replay_cases() + _infinite_s_cases() + _bf16_bounded_cases()


# A bounded bfloat16 site: 64 terms, S = 2^20 at values in [1, 2), so beta = 512 units of 2^-29
# of a bfloat16 gap (2^-7), t_e = 1282 (an entry accepted up to 2564) and m_e = 204.8. The
# distances D of the values from their bfloat16 midpoint:
_BF16_D = [0, 100, 1000, 2000, 100_000, 1 << 28]


def _bf16_bounded_cases() -> list[dict[str, Any]]:
    v = np.array([1.0 + ((1 << 44) + d * (1 << 16)) * 2.0**-52 if d < 1 << 28 else 1.5
                  for d in _BF16_D])  # fmt: skip
    e, add, cases = _site_cases("mm.default", _BOUND_K, None, 2.0**20, v, bfloat16=True)
    assert [x[1] for x in e] == [0, 1, 2]  # D = 0, 100, 1000: within t_e = 1282
    add("bounded bfloat16 site: honest log (elements within t_e = 1282 of a midpoint)", e)
    add("bounded bfloat16 site: entry between t_e and 2·t_e (allowed)", [*e, (0, 3, 1)])
    add("bounded bfloat16 site: entry at D = 100000, within the job's t but not the bound",
        [*e, (0, 4, 0)], "ROUNDING_LOG_INVALID")  # fmt: skip
    add("bounded bfloat16 site: entry within m_e = 204.8 dropped (D = 100)",
        [x for x in e if x[1] != 1], "ROUNDING_LOG_MISSING")  # fmt: skip
    add("bounded bfloat16 site: entry between m_e and t_e dropped (D = 1000; not demanded)",
        [x for x in e if x[1] != 2])  # fmt: skip
    return cases


def _infinite_s_cases() -> list[dict[str, Any]]:
    """SPEC VI §2: a bounded element whose β is not finite (its S is; here S = inf) has the
    caps for thresholds: t_e = T_cap = 2^26, m_e = 2^25."""
    e, add, cases = _site_cases("mm.default", _BOUND_K, None, float("inf"))
    assert [x[1] for x in e] == list(range(7))  # every D up to 60,000: within T_cap
    add("bounded site, beta not finite: thresholds at the caps (all 7 near values logged)", e)
    add("bounded site, beta not finite: entry at D = 60000 <= T_cap/2 dropped",
        [x for x in e if x[1] != 6], "ROUNDING_LOG_MISSING")  # fmt: skip
    add("bounded site, beta not finite: entry on an exact float32 value (D = 2^28 > 2·T_cap)",
        [*e, (0, 7, 0)], "ROUNDING_LOG_INVALID")  # fmt: skip
    return cases


# A blocked bounded site (SPEC VI §1, §2): a convolution's weight gradient of K = 8192 terms
# summed in blocks of one 8×8 image (64 terms), so K' = 72 in γ and beta ≈ 72.1, t_e ≈ 182 (an
# entry accepted up to ≈ 364) and m_e ≈ 28.8; with K in γ, t_e would be ≈ 20,500.
_BLOCK_K, _BLOCK_KSUM = 8192, 72


def _blocked_replay_cases() -> list[dict[str, Any]]:
    e, add, cases = _site_cases("convolution_backward.default", _BLOCK_K, _BLOCK_KSUM)
    assert [x[1] for x in e] == [0, 1, 2]  # D = 0, 20, 100: within t_e ≈ 182
    add("blocked site (K = 8192, K' = 72): honest log (elements within t_e ≈ 182)", e)
    add("blocked site: entry between t_e and 2·t_e (D = 300, allowed)", [*e, (0, 3, 1)])
    add("blocked site: entry at D = 1000, inside the unblocked bound (γ_K) but not the blocked "
        "one (γ_K')", [*e, (0, 4, 1)], "ROUNDING_LOG_INVALID")  # fmt: skip
    add("blocked site: entry within m_e ≈ 28.8 dropped (D = 20)",
        [x for x in e if x[1] != 1], "ROUNDING_LOG_MISSING")  # fmt: skip
    return cases


# SPEC VI §1: K and K' of the outputs of bounded operations, from their arguments' shapes.
_CONV = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "transposed": False,
         "output_padding": [0, 0], "groups": 1, "bias": False}  # fmt: skip


def _blocks_cases() -> list[dict[str, Any]]:
    from dk.vectors.rounding import block_counts

    fwd, bwd = "convolution", "convolution_backward"
    specs: list[tuple[str, str, dict[str, Any]]] = [
        ("3×3, 16 channels: blocks of 7 channels (63 terms)", fwd,
         {"x": [32, 16, 16, 16], "w": [16, 16, 3, 3]}),
        ("the same with a bias (K counts it, K' does not change)", fwd,
         {"x": [32, 16, 16, 16], "w": [16, 16, 3, 3], "bias": True}),
        ("3×3, 7 channels: one block, K' = K", fwd, {"x": [4, 7, 8, 8], "w": [5, 7, 3, 3]}),
        ("groups 2: 16 channels per group, blocked per group", fwd,
         {"x": [4, 32, 8, 8], "w": [8, 16, 3, 3], "groups": 2}),
        ("1×1, 100 channels: blocks of 64 channels", fwd,
         {"x": [2, 100, 5, 5], "w": [3, 100, 1, 1]}),
        ("7×7 over 3 channels: one channel (49 terms) per block", fwd,
         {"x": [2, 3, 20, 20], "w": [8, 3, 7, 7], "stride": [2, 2], "padding": [3, 3]}),
        ("transposed, 24 input channels (w is in × out/groups × k × k)", fwd,
         {"x": [2, 24, 5, 5], "w": [24, 8, 3, 3], "transposed": True}),
        ("32 images of 16×16: grad input one block; grad weight, grad bias by images", bwd,
         {"go": [32, 16, 16, 16], "x": [32, 16, 16, 16], "w": [16, 16, 3, 3]}),
        ("8 images of 4×4: 4 images (64 terms) per block", bwd,
         {"go": [8, 6, 4, 4], "x": [8, 5, 4, 4], "w": [6, 5, 3, 3]}),
        ("2 images of 4×4: one block, K' = K", bwd,
         {"go": [2, 6, 4, 4], "x": [2, 5, 4, 4], "w": [6, 5, 3, 3]}),
        ("stride 2: the weight's unit is the larger input image, the bias's the output image", bwd,
         {"go": [3, 4, 4, 4], "x": [3, 2, 8, 8], "w": [4, 2, 3, 3], "stride": [2, 2]}),
        ("a mask without the input gradient", bwd,
         {"go": [32, 16, 16, 16], "x": [32, 16, 16, 16], "w": [16, 16, 3, 3],
          "mask": [False, True, False]}),
    ]  # fmt: skip
    cases = []
    for comment, op, given in specs:
        args = {**_CONV, **given}
        if op == bwd:
            args.setdefault("mask", [True, True, True])
        k, k_sum = block_counts(op, args)
        cases.append({"comment": comment, "op": op, "args": args, "k": k, "k_sum": k_sum})
    return cases


def _number(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"tcId": i + 1, **c} for i, c in enumerate(cases)]


def generate(root: Path, *, bundles: bool = True) -> None:
    """Write ``root/rounding/log.json``, ``replay.json`` and (``bundles``) ``bundle/``."""
    from vectors.gen import rounding_bundle

    write_cases(root / "rounding" / "log.json", "rounding-log", _number(_log_cases()))
    write_cases(
        root / "rounding" / "replay.json",
        "rounding-replay",
        _number(_replay_cases() + _bounded_replay_cases() + _bf16_replay_cases()),
    )
    write_cases(root / "rounding" / "blocks.json", "rounding-blocks", _number(_blocks_cases()))
    if bundles:
        rounding_bundle.generate(root)
