"""The verification report (SPEC §14): digest coverage, check(), JSON form, reason codes."""

from __future__ import annotations

import hashlib
import json

import pytest
import rfc8785

from dk.errors import VerificationFailed
from dk.verifier import Finding, Reason, Report


def _accepted() -> Report:
    r = Report(
        job_id="aa" * 32,
        worker_key="bb" * 32,
        transcript_root="cc" * 32,
        beacon="00" * 32,
        mode="exact",
        challenged=[1, 4],
    )
    for c in ("manifest", "signature", "replay"):
        r.passed(c)
    r.figures.update(verify_wall_s=0.5, bytes_read=1000)
    return r


def test_accepted_report() -> None:
    r = _accepted()
    assert r.ok and r.verdict == "accept" and r.codes == []
    assert r.check() is r
    # SPEC §14.2 from the text: the body written out by hand, canonicalised by the rfc8785
    # library (JCS; every value here is a string, a small integer or a list of them) and
    # hashed with hashlib under the literal tag: nothing of dk's encoder or hashing is reused.
    body = {"verdict": "accept", "reasons": [], "job_id": "aa" * 32, "worker_key": "bb" * 32,
            "transcript_root": "cc" * 32, "beacon": "00" * 32, "mode": "exact",
            "challenged": [1, 4], "flags": []}  # fmt: skip
    tag = b"dk/v1/report"
    want = hashlib.sha256(bytes([len(tag)]) + tag + rfc8785.dumps(body)).digest()
    assert r.digest() == want


def test_digest_ignores_figures() -> None:
    a, b = _accepted(), _accepted()
    b.figures.update(verify_wall_s=99.0, replay_wall_s=3.0, bytes_read=5)
    assert a.digest() == b.digest()


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.fail("replay", Reason.REPLAY_MISMATCH, "interval 1 differs", 1),
        lambda r: setattr(r, "beacon", "01" * 32),
        lambda r: setattr(r, "challenged", [1, 5]),
        lambda r: setattr(r, "mode", "tolerant"),
        lambda r: setattr(r, "job_id", "ab" * 32),
        lambda r: setattr(r, "worker_key", "ab" * 32),
        lambda r: setattr(r, "transcript_root", "ab" * 32),
        lambda r: r.flags.append("mock-prover"),
    ],
)
def test_digest_covers_the_verdict_and_inputs(change: object) -> None:
    a, b = _accepted(), _accepted()
    change(b)  # type: ignore[operator]
    assert a.digest() != b.digest()


def test_digest_ignores_finding_order_and_messages() -> None:
    a, b = _accepted(), _accepted()
    a.fail("replay", Reason.REPLAY_MISMATCH, "one", 1)
    a.fail("metadata", Reason.METADATA_MISMATCH, "two", 2)
    b.fail("metadata", Reason.METADATA_MISMATCH, "other words", 2)
    b.fail("replay", Reason.REPLAY_MISMATCH, "and more", 1)
    assert a.digest() == b.digest()
    assert a.codes == ["REPLAY_MISMATCH", "METADATA_MISMATCH"]


def test_check_raises_with_the_first_reason() -> None:
    r = _accepted()
    r.fail("signature", Reason.SIGNATURE_INVALID, "Ed25519 signature does not verify")
    r.fail("replay", Reason.REPLAY_MISMATCH, "later")
    assert not r.ok and r.verdict == "reject"
    assert r.checks["signature"] == "fail"
    r.passed("signature")  # a failed check stays failed
    assert r.checks["signature"] == "fail"
    with pytest.raises(VerificationFailed, match="SIGNATURE_INVALID: Ed25519") as ei:
        r.check()
    assert ei.value.reason is Reason.SIGNATURE_INVALID and ei.value.report is r


def test_a_report_with_no_checks_is_not_an_accept() -> None:
    r = Report()
    assert not r.ok
    with pytest.raises(VerificationFailed) as ei:
        r.check()
    assert ei.value.reason is Reason.INTERNAL_ERROR


def test_json_form() -> None:
    r = _accepted()
    r.fail("replay", Reason.REPLAY_MISMATCH, "interval 4 differs", 4)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["ok"] is False and d["verdict"] == "reject" and d["reasons"] == ["REPLAY_MISMATCH"]
    assert d["findings"] == [
        {"code": "REPLAY_MISMATCH", "message": "interval 4 differs", "interval": 4}
    ]
    assert d["figures"]["bytes_read"] == 1000 and d["digest"] == r.digest().hex()
    assert Finding(Reason.BLOB_MISSING, "m").to_dict() == {"code": "BLOB_MISSING", "message": "m"}


def test_reason_codes_are_their_names() -> None:
    assert all(r.value == r.name for r in Reason)
    assert len({r.value for r in Reason}) == len(Reason)
