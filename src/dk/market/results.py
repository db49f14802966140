"""Results: the worker's bundle commitment, the market's verification, acceptance (spec §5).

The commitment a worker submits is ``(transcript_root, manifest_digest)`` where
``manifest_digest = tagged_hash("dk/v1/market/manifest", manifest.json bytes)``. The challenge
beacon for the verifier is fixed afterwards by the order's drawn validators
(:mod:`dk.market.beacon`), never by anything the worker sends. A verification has three
outcomes (``report.verdict``): ``accept``, ``reject`` (the only one that moves money) and
``inconclusive`` (recorded, nothing moves, the order stays verifiable).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dk.crypto.canonical_json import parse_json
from dk.crypto.hashing import tagged_hash
from dk.errors import FormatError
from dk.market import fields
from dk.market.accounts import acct
from dk.market.config import Context
from dk.market.errors import MarketRefused
from dk.market.ledger import Tx
from dk.market.orders import escrow, load_order, stake
from dk.market.requests import SignedRequest

TAG_MANIFEST = "dk/v1/market/manifest"
MAX_MANIFEST = 16 * 1024 * 1024


def read_manifest(bundle_dir: str | Path) -> tuple[dict[str, Any], bytes]:
    """Read a bundle's ``manifest.json`` (bounded) and return ``(manifest, manifest_digest)``.

    Raises:
        FormatError: if the manifest is missing, too large, or lacks the fields the market uses.
    """
    path = Path(bundle_dir) / "manifest.json"
    if not path.is_file():
        raise FormatError(f"no manifest.json in {bundle_dir}")
    with open(path, "rb") as f:
        raw = f.read(MAX_MANIFEST + 1)
    manifest = parse_json(raw, limit=MAX_MANIFEST, what="bundle manifest")
    if not isinstance(manifest, dict):
        raise FormatError("bundle manifest must be a JSON object")
    for name in ("job_id", "worker_key", "transcript_root"):
        fields.digest_hex(manifest, name)
    return manifest, tagged_hash(TAG_MANIFEST, raw)


def bundle_commitment(bundle_dir: str | Path) -> dict[str, str]:
    """The commitment a worker submits for a bundle: ``transcript_root`` and ``manifest_digest``."""
    manifest, digest = read_manifest(bundle_dir)
    return {"transcript_root": manifest["transcript_root"], "manifest_digest": digest.hex()}


def check_bundle(order: Any, bundle_dir: str | Path) -> dict[str, Any]:
    """Check that ``bundle_dir`` is the bundle the worker committed to for ``order``.

    Returns:
        The parsed manifest.

    Raises:
        MarketRefused: ``BUNDLE_MISMATCH`` if the job, worker key or commitment differ.
    """
    manifest, digest = read_manifest(bundle_dir)
    committed = json.loads(order["commitment"])
    if manifest["job_id"] != order["job_id"]:
        raise MarketRefused("BUNDLE_MISMATCH", "the bundle is for another job")
    if manifest["worker_key"] != order["worker"]:
        raise MarketRefused("BUNDLE_MISMATCH", "the bundle was signed by another worker key")
    if (manifest["transcript_root"], digest.hex()) != (
        committed["transcript_root"],
        committed["manifest_digest"],
    ):
        raise MarketRefused("BUNDLE_MISMATCH", "the bundle is not the committed one")
    return manifest


def submit(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """The matched worker commits to a bundle for an order (before the deadline).

    Raises:
        MarketRefused: ``UNKNOWN_ORDER``, ``NOT_OWNER``, ``BAD_STATE``, ``DEADLINE_PASSED``.
    """
    fields.only(req.params, {"order_id", "transcript_root", "manifest_digest"})
    order_id = fields.object_id(req.params, "order_id", "o")
    commitment = {
        "transcript_root": fields.digest_hex(req.params, "transcript_root"),
        "manifest_digest": fields.digest_hex(req.params, "manifest_digest"),
        "submit_seq": tx.seq,
    }
    load_order(tx, order_id, state="matched", account=req.account, role="worker", now=now)
    tx.exec(
        "UPDATE orders SET state = 'submitted', commitment = ?, share_deadline = ?"
        " WHERE order_id = ?",
        (json.dumps(commitment, sort_keys=True), now + ctx.config.share_timeout, order_id),
    )
    tx.data = {"order_id": order_id, **commitment}


VERDICTS = ("accept", "reject", "inconclusive")


def verdict_of(result: Any) -> str:
    """``accept``, ``reject`` or ``inconclusive`` of a report or replay result.

    Reads ``result.verdict``; without one, ``result.ok`` or a plain truth value (an older
    ``replay_interval`` returns a bool) maps to accept/reject. An unknown verdict is treated
    as ``inconclusive`` (nothing moves: never the worker's fault).
    """
    if isinstance(result, bool):
        return "accept" if result else "reject"
    verdict = getattr(result, "verdict", None)
    if verdict is None:
        return "accept" if getattr(result, "ok", result) else "reject"
    return verdict if verdict in VERDICTS else "inconclusive"


def _codes(report: Any) -> list[str]:
    codes = getattr(report, "codes", None)
    if codes is None:
        codes = [getattr(r, "code", r) for r in getattr(report, "reasons", [])]
    return [str(c) for c in codes][:32]


def record_verification(
    tx: Tx,
    order_id: str,
    beacon: bytes,
    report: Any,
    now: int,
    *,
    fixed: dict[str, int] | None = None,
    blame: list[int] | None = None,
) -> None:
    """Store the market's verification of a submitted order by its verdict.

    ``accept``: state ``verified`` with ``report_digest``. ``reject``: the escrow returns to
    the consumer and the worker's stake is slashed to the consumer (outcome ``rejected``).
    ``inconclusive``: recorded, nothing moves, the order stays ``submitted``. ``fixed``
    (``samples`` and ``intervals``) is the economic default the verification used, written
    into the order's policy and the event whatever the verdict (SPEC V §10). ``blame``: the
    ranks a rejecting report names (a cluster order slashes only those, SPEC V §14.5).

    Raises:
        MarketRefused: ``BAD_STATE`` if the order is no longer ``submitted`` or its beacon
            is not the one verified against.
    """
    order = tx.one("SELECT * FROM orders WHERE order_id = ?", (order_id,))
    if order is None or order["state"] != "submitted":
        raise MarketRefused("BAD_STATE", f"{order_id} is not awaiting verification")
    if order["beacon"] != beacon.hex():
        raise MarketRefused("BAD_STATE", f"{order_id} was verified against another beacon")
    verdict = verdict_of(report)
    digest = bytes(report.digest()).hex()
    tx.data = {
        "order_id": order_id,
        "verdict": verdict,
        "ok": verdict == "accept",
        "report_digest": digest,
        "beacon": beacon.hex(),
        "reasons": _codes(report),
    }
    if fixed is not None:
        policy = json.loads(order["policy"])
        if policy["samples"] is not None:
            raise MarketRefused("BAD_STATE", f"{order_id}'s samples are fixed already")
        policy.update(fixed)
        tx.exec(
            "UPDATE orders SET policy = ? WHERE order_id = ?",
            (json.dumps(policy, sort_keys=True), order_id),
        )
        tx.data.update(fixed)
    if verdict == "inconclusive":
        return
    if verdict == "accept":
        tx.exec(
            "UPDATE orders SET state = 'verified', report_digest = ? WHERE order_id = ?",
            (digest, order_id),
        )
        # what the attesters vouch for: a whistle names one of these (SPEC V §13)
        chal = [int(i) for i in getattr(report, "challenged", [])]
        tx.exec(
            "INSERT INTO verdicts(order_id, challenged, seq) VALUES(?, ?, ?)",
            (order_id, json.dumps(chal), tx.seq),
        )
        tx.data["challenged"] = chal
        return
    tx.exec(
        "UPDATE orders SET state = 'rejected', outcome = 'rejected', report_digest = ?"
        " WHERE order_id = ?",
        (digest, order_id),
    )
    pay_out(tx, order, escrow_to=order["consumer"], stake_to=order["consumer"], blame=blame or [])
    tx.data["outcome"] = "rejected"


def pay_out(
    tx: Tx, order: Any, *, escrow_to: str, stake_to: str, blame: list[int] | None = None
) -> None:
    """Empty an order's escrow and stake holders into the named accounts.

    A cluster order pays by rank (:func:`dk.market.cluster_flow.pay_out`, SPEC V §14.5):
    ``blame`` names the ranks whose stake goes to ``stake_to`` (None: every rank).
    """
    from dk.market import cluster_flow

    if cluster_flow.world_size(tx.con, order["order_id"]) > 1:
        cluster_flow.pay_out(tx, order, escrow_to=escrow_to, stake_to=stake_to, blame=blame)
        return
    oid = order["order_id"]
    pay = tx.amount(escrow(oid))
    if pay:
        tx.move(escrow(oid), acct(escrow_to), pay)
    held = tx.amount(stake(oid))
    if held:
        tx.move(stake(oid), acct(stake_to), held)


def record_acceptance(
    tx: Tx, order_id: str, signers: list[str], aggregate: bytes, now: int
) -> None:
    """Mark a verified order accepted and open its challenge window.

    Raises:
        MarketRefused: ``BAD_STATE``, ``DEADLINE_PASSED``.
    """
    order = tx.one("SELECT * FROM orders WHERE order_id = ?", (order_id,))
    if order is None or order["state"] != "verified":
        raise MarketRefused("BAD_STATE", f"{order_id} is not verified")
    if now >= order["deadline"]:
        raise MarketRefused("DEADLINE_PASSED", f"{order_id} expired at {order['deadline']}")
    window = json.loads(order["policy"])["window"]
    tx.exec(
        "UPDATE orders SET state = 'accepted', accepted_at = ?, window_end = ?, attesters = ?"
        " WHERE order_id = ?",
        (now, now + window, json.dumps(signers), order_id),
    )
    tx.data = {
        "order_id": order_id,
        "signers": signers,
        "aggregate": aggregate.hex(),
        "report_digest": order["report_digest"],
        "window_end": now + window,
    }
