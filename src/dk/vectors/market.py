"""Check ``vectors/market/`` with the library (SPEC.md Part V)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dk.crypto.canonical_json import canonical_json
from dk.errors import FormatError
from dk.market.attest import PyEccBls, attestation_message
from dk.market.audit import audit_events
from dk.market.beacon import beacon_from, draw, draw_seed, share_message
from dk.market.ledger import ZERO_HASH, chain_problem
from dk.market.requests import parse_request
from dk.vectors import CaseResult, run_cases
from dk.vectors.market_cluster import check_case as check_cluster_case

AREA = "market"


def _request_case(case: dict[str, Any]) -> str:
    market_id = bytes.fromhex(case["market_id"])
    try:
        req = parse_request(case["request"].encode("utf-8"), market_id=market_id)
    except FormatError as e:
        if case["result"] == "valid":
            return f"rejected a valid request: {e}"
        return (
            ""
            if e.reason == case["expected_reason"]
            else (f"rejected with {e.reason}, expected {case['expected_reason']}")
        )
    if case["result"] != "valid":
        return "accepted an invalid request"
    body = canonical_json(req.envelope["body"]).decode()
    got = (req.account, req.nonce, req.action, body)
    want = (case["account"], case["nonce"], case["action"], case["signed_message"])
    return "" if got == want else "parsed fields differ"


def _events_case(case: dict[str, Any]) -> str:
    prev, problem = ZERO_HASH, None
    for seq, ev in enumerate(case["events"]):
        problem = chain_problem(
            seq, prev, bytes.fromhex(ev["prev_hash"]), bytes.fromhex(ev["hash"]), ev["body"]
        )
        if problem:
            break
        prev = bytes.fromhex(ev["hash"])
    if case["result"] == "valid":
        return "" if problem is None else f"valid chain refused: {problem}"
    return (
        ""
        if problem == case["expected_reason"]
        else (f"got {problem}, expected {case['expected_reason']}")
    )


def _attestation_case(case: dict[str, Any], bls: Any) -> str:
    msg = attestation_message(
        bytes.fromhex(case["market_id"]), case["order_id"], bytes.fromhex(case["report_digest"])
    )
    if msg.hex() != case["message"]:
        return "attestation message differs"
    pk = bytes.fromhex(case["bls_pk"])
    reason = None
    if not bls.pop_verify(pk, bytes.fromhex(case["pop"])):
        reason = "BAD_POP"
    elif not bls.verify(pk, msg, bytes.fromhex(case["signature"])):
        reason = "BAD_ATTESTATION"
    want = None if case["result"] == "valid" else case["expected_reason"]
    return "" if reason == want else f"got {reason}, expected {want}"


def _verdict(case: dict[str, Any], reason: str | None) -> str:
    want = None if case["result"] == "valid" else case["expected_reason"]
    return "" if reason == want else f"got {reason}, expected {want}"


def _beacon_case(case: dict[str, Any], bls: Any, seen: dict[tuple[bytes, ...], bool]) -> str:
    msg = share_message(
        bytes.fromhex(case["market_id"]),
        case["order_id"],
        bytes.fromhex(case["transcript_root"]),
        bytes.fromhex(case["manifest_digest"]),
    )
    if msg.hex() != case["message"]:
        return "share message differs"
    shares = [bytes.fromhex(x) for x in case["shares"]]
    pks = [bytes.fromhex(x) for x in case["bls_pks"]]

    def verify(pk: bytes, share: bytes) -> bool:  # the cases repeat shares: pair once each
        if (pk, msg, share) not in seen:
            seen[pk, msg, share] = bls.verify(pk, msg, share)
        return seen[pk, msg, share]

    reason = None
    if len(shares) != len(pks) or not all(
        verify(pk, sh) for pk, sh in zip(pks, shares, strict=False)
    ):
        reason = "BAD_SHARE"
    elif bls.aggregate(shares).hex() != case["aggregate"] or (
        beacon_from(bytes.fromhex(case["aggregate"])).hex() != case["beacon"]
    ):
        reason = "BEACON_MISMATCH"
    return _verdict(case, reason)


def _draw_case(case: dict[str, Any]) -> str:
    seed = draw_seed(
        bytes.fromhex(case["market_id"]),
        bytes.fromhex(case["prev_head"]),
        case["order_id"],
        case["round"],
        bytes.fromhex(case["entropy"]),
    )
    if seed.hex() != case["seed"] and case["result"] == "valid":
        return "draw seed differs"
    ok = draw(seed, case["eligible"], case["count"]) == case["drawn"]
    return _verdict(case, None if ok else "DRAW_MISMATCH")


def _ledger_case(case: dict[str, Any]) -> str:
    events = [
        (ev["body"]["seq"], bytes.fromhex(ev["prev_hash"]), bytes.fromhex(ev["hash"]), ev["body"])
        for ev in case["events"]
    ]
    report = audit_events(events, None, check_bls=False)
    if case["result"] == "valid":
        return "" if report.ok else f"valid ledger refused: {report.problems[:2]}"
    code = case["expected_reason"]
    if any(f": {code}:" in p for p in report.problems):
        return ""
    return f"expected {code}, got {report.problems[:2]}"


def check(root: Path) -> list[CaseResult]:
    """Re-derive every case under ``root/market/``.

    Args:
        root: the ``vectors/`` directory.

    Returns:
        One :class:`CaseResult` per case.
    """
    bls = PyEccBls()
    seen: dict[tuple[bytes, ...], bool] = {}
    checks = {
        "request.json": _request_case,
        "events.json": _events_case,
        "attestation.json": lambda c: _attestation_case(c, bls),
        "beacon.json": lambda c: _beacon_case(c, bls, seen),
        "draw.json": _draw_case,
        "ledger.json": _ledger_case,
        "cluster.json": check_cluster_case,  # SPEC V §14
    }
    return run_cases(root, AREA, checks)
