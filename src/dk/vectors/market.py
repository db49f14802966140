"""Check ``vectors/market/`` with the library (SPEC.md Part V)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dk.crypto.canonical_json import canonical_json
from dk.errors import FormatError
from dk.market.attest import PyEccBls, attestation_message
from dk.market.ledger import ZERO_HASH, chain_problem
from dk.market.requests import parse_request
from dk.vectors import CaseResult, run_cases

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


def check(root: Path) -> list[CaseResult]:
    """Re-derive every case under ``root/market/``.

    Args:
        root: the ``vectors/`` directory.

    Returns:
        One :class:`CaseResult` per case.
    """
    bls = PyEccBls()
    checks = {
        "request.json": _request_case,
        "events.json": _events_case,
        "attestation.json": lambda c: _attestation_case(c, bls),
    }
    return run_cases(root, AREA, checks)
