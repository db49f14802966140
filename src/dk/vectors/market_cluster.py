"""Check ``vectors/market/cluster.json`` with the library (SPEC.md Part V §14)."""

from __future__ import annotations

from typing import Any

from dk.crypto.keys import VerifyKey
from dk.errors import FormatError
from dk.market.cluster import (
    bad_rank_signatures,
    manifest_ranks,
    rank_message,
    rank_shares,
    sample_counts,
    world_size_param,
)


def _verdict(case: dict[str, Any], reason: str | None) -> str:
    want = None if case["result"] == "valid" else case["expected_reason"]
    return "" if reason == want else f"got {reason}, expected {want}"


def _shares(case: dict[str, Any]) -> str:
    w, b = case["world_size"], case["batch_size"]
    if sample_counts(w, b) != case["sample_counts"]:
        return "sample counts differ"
    ok = rank_shares(case["price"], w, b) == case["shares"]
    return _verdict(case, None if ok else "SHARE_MISMATCH")


def _order_params(case: dict[str, Any]) -> str:
    try:
        got = world_size_param(case["params"])
    except FormatError as e:
        return _verdict(case, e.reason)
    if case["result"] == "valid" and got != case["world_size"]:
        return f"world_size {got}, expected {case['world_size']}"
    return _verdict(case, None)


def _rank_signature(case: dict[str, Any]) -> str:
    key = bytes.fromhex(case["worker_key"])
    msg = rank_message(
        bytes.fromhex(case["job_id"]), bytes.fromhex(case["transcript_root"]), case["rank"], key
    )
    if msg.hex() != case["message"]:
        return "rank message differs"
    ok = VerifyKey(key).verify(bytes.fromhex(case["signature"]), msg)
    return _verdict(case, None if ok else "BAD_RANK_SIGNATURE")


def _manifest(case: dict[str, Any]) -> str:
    try:
        keys, _ = manifest_ranks(case["manifest"])
        reason = "BUNDLE_MISMATCH" if bad_rank_signatures(case["manifest"]) else None
    except FormatError:
        return _verdict(case, "BUNDLE_MISMATCH")
    if reason is None and keys != case["rank_keys"]:
        return "rank keys differ"
    return _verdict(case, reason)


def _ledger(case: dict[str, Any]) -> str:
    """A whole ledger, audited exactly as ``vectors/market/ledger.json``'s cases are."""
    from dk.vectors.market import _ledger_case  # (dk.vectors.market imports this module)

    return _ledger_case(case)


KINDS = {
    "shares": _shares,
    "order_params": _order_params,
    "rank_signature": _rank_signature,
    "manifest": _manifest,
    "ledger": _ledger,
}


def check_case(case: dict[str, Any]) -> str:
    """Re-derive one case of ``cluster.json``; ``""`` when it holds."""
    return KINDS[case["kind"]](case)
