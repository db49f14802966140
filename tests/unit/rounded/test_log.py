"""The rounding log's byte format (SPEC VI §3-§4): round trips, strict parsing, binding."""

from __future__ import annotations

import pytest

from dk.errors import FormatError
from dk.pol.backends.log import (
    FIXED_HEADER_SIZE,
    LOG_MALFORMED,
    LOG_MISMATCH,
    MAX_ENTRIES,
    RoundingLog,
    check_binding,
    decode_log,
    log_digest,
)

JOB = bytes(range(32))


def _log(**kw: object) -> RoundingLog:
    base = {"job_id": JOB, "interval": 2, "tau_log2": 12, "sites": 10, "trace": b"\x07" * 32,
            "entries": [(0, 0, 1), (0, 5, 0), (3, 1000, 1), (9, 2**40, 0)]}  # fmt: skip
    return RoundingLog(**{**base, **kw})  # type: ignore[arg-type]


H = FIXED_HEADER_SIZE + 3  # _log()'s interval 2, sites 10 and count 4: one varint byte each


def test_round_trip_and_layout() -> None:
    log = _log()
    blob = log.encode()
    assert decode_log(blob) == log
    assert blob[:8] == b"DKRL\x06\x01\x0c\x00" and blob[8:40] == JOB
    assert blob[40:72] == b"\x07" * 32 and blob[72:H] == bytes([2, 10, 4])
    # group of site 0: delta 0, 2 entries and first direction 1 (2·1 + 1 = 3), first element 0,
    # r = 2 (one gap of 5 - 0 - 1 = 4), bits: direction 0, gap 4 = unary 1, 0, low bits 00,
    # padding 000 (0x40); group of site 3: delta 3, 1 entry and direction 1 (2·0 + 1),
    # element 1000 (0xE8 0x07), no r and no bits; group of site 9: delta 6, size 0, element
    # 2^40 (five 0x80 bytes, then 0x20)
    assert blob[H:] == bytes([0, 3, 0, 2, 0x40, 3, 1, 0xE8, 0x07, 6, 0]) + bytes(
        [0x80] * 5 + [0x20]
    )


def test_empty_log() -> None:
    log = _log(entries=[], sites=0)
    assert decode_log(log.encode()) == log and len(log.encode()) == FIXED_HEADER_SIZE + 3


def _head(b: bytes, interval: int = 2, sites: int = 10, count: int = 4) -> bytes:
    return b[:FIXED_HEADER_SIZE] + bytes([interval, sites, count])


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b"DKRX" + b[4:],  # magic
        lambda b: b[:4] + b"\x01" + b[5:],  # version 1 (the draft's varint entries)
        lambda b: b[:4] + b"\x02" + b[5:],  # version 2 (fixed thresholds everywhere)
        lambda b: b[:4] + b"\x03" + b[5:],  # version 3 (convolutions not blocked)
        lambda b: b[:4] + b"\x05" + b[5:],  # version 5 (u64 header fields, r in every group)
        lambda b: b[:5] + b"\x02" + b[6:],  # precision
        lambda b: b[:6] + b"\x05" + b[7:],  # tau_log2 below 6
        lambda b: b[:7] + b"\x01" + b[8:],  # reserved byte
        lambda b: b + b"\x00",  # trailing byte
        lambda b: b[:-1],  # truncated
        lambda b: b[: H - 1],  # short header
        lambda b: _head(b, count=5) + b[H:],  # count larger than entries
        lambda b: _head(b, sites=3) + b[H:],  # site 9 >= sites 3
        lambda b: b[:H] + b"\x80\x00" + b[H + 1 :],  # non-minimal varint
        lambda b: b[: H + 4] + b"\x41" + b[H + 5 :],  # padding bit set
        lambda b: b[: H + 4] + b"\x60" + b[H + 5 :],  # gap 8 coded with r 2: not canonical
        lambda b: b[: H + 3] + b"\x30" + b[H + 4 :],  # r = 48
        lambda b: b[: H + 1] + b"\x09" + b[H + 2 :],  # group of 5 entries, 4 in the log
        # a whole group of two entries (bits 1, gap 0) where the count says one
        lambda b: _head(b, count=1) + bytes([0, 2, 0, 0, 0x80]),
        # a group's first element 2^48 (seven varint bytes)
        lambda b: _head(b, count=1) + bytes([0, 0] + [0x80] * 6 + [0x40]),
    ],
)
def test_malformed_blobs_rejected(mutate: object) -> None:
    blob = mutate(_log().encode())  # type: ignore[operator]
    with pytest.raises(FormatError) as e:
        decode_log(blob)
    assert e.value.reason == LOG_MALFORMED


def test_encoder_refuses_bad_logs() -> None:
    with pytest.raises(FormatError):
        _log(entries=[(3, 1, 0), (0, 1, 0)]).encode()
    with pytest.raises(FormatError):
        _log(entries=[(10, 1, 0)]).encode()  # site >= sites
    with pytest.raises(FormatError):
        _log(entries=[(0, 1, 2)]).encode()
    with pytest.raises(FormatError):
        _log(entries=[(0, i, 0) for i in range(MAX_ENTRIES + 1)], sites=1).encode()


def test_binding_to_job_interval_and_tau() -> None:
    log = _log()
    check_binding(log, job_id=JOB, interval=2, tau_log2=12)
    for kw in ({"job_id": bytes(32)}, {"interval": 3}, {"tau_log2": 13}):
        args = {"job_id": JOB, "interval": 2, "tau_log2": 12, **kw}
        with pytest.raises(FormatError) as e:
            check_binding(log, **args)  # type: ignore[arg-type]
        assert e.value.reason == LOG_MISMATCH


def test_rice_round_trips_long_groups_and_windows() -> None:
    """Groups longer than the decoder's bit window, gaps from 1 to 2^40, both directions."""
    import random

    rng = random.Random(7)
    for spread in (1, 600, 10**6, 2**40):
        elems = sorted(rng.sample(range(min(spread * 10_000, 2**47)), 10_000))
        log = _log(entries=[(4, e, rng.randint(0, 1)) for e in elems])
        assert decode_log(log.encode()) == log


def test_many_small_groups_and_long_ones_round_trip() -> None:
    """The bit reader's window starts small and grows (log.py ``_Bits``): many groups of two
    entries, then groups longer than any window, round trip."""
    import random

    rng = random.Random(11)
    entries = [(s, e, rng.randint(0, 1)) for s in range(3000) for e in (0, rng.randint(1, 999))]
    entries += [(3000 + s, e, rng.randint(0, 1)) for s in range(3) for e in range(0, 90_000, 3)]
    log = _log(sites=3003, entries=entries)
    assert decode_log(log.encode()) == log


def test_entry_and_byte_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MAX_ENTRIES`` and ``MAX_LOG_BYTES`` (SPEC VI §3), lowered so that logs at the limits
    are small: a log at each limit is encoded and decodes; one past it is refused by both."""
    import dk.pol.backends.log as mod

    at = _log(entries=[(0, e, 1) for e in range(6)])
    over = _log(entries=[(0, e, 1) for e in range(7)])
    over_blob = over.encode()
    monkeypatch.setattr(mod, "MAX_ENTRIES", 6)
    assert decode_log(at.encode()) == at
    with pytest.raises(FormatError):
        over.encode()
    with pytest.raises(FormatError) as e:
        decode_log(over_blob)
    assert e.value.reason == LOG_MALFORMED
    monkeypatch.setattr(mod, "MAX_ENTRIES", 1 << 24)
    blob = at.encode()
    monkeypatch.setattr(mod, "MAX_LOG_BYTES", len(blob))
    assert decode_log(blob) == at
    monkeypatch.setattr(mod, "MAX_LOG_BYTES", len(blob) - 1)
    with pytest.raises(FormatError) as e:
        decode_log(blob)
    assert e.value.reason == LOG_MALFORMED
    with pytest.raises(FormatError):
        at.encode()


def test_log_digest_commits_to_every_blob() -> None:
    blobs = [_log(interval=i).encode() for i in range(3)]
    assert len({log_digest(b) for b in blobs}) == 3
