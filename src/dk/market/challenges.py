"""Challenges: dispute an accepted result during its window; one replay decides (spec §6.2).

A challenger posts a bond and names either an interval index or its own list of checkpoint
roots (a counter-transcript). With a counter-transcript, bisection finds an interval whose
start both transcripts agree on and whose end they do not; that interval is replayed from the
worker's bundle. If the replay fails, the challenge is *upheld*: the challenger gets its bond
back plus the worker's slashed stake and the whole stake of every validator who attested the
wrong result, the consumer gets the escrow back, and other open challenges of the order are
voided (bonds returned). If the replay accepts, the challenge *fails* and the bond goes to the
worker. If the replay is *inconclusive* (the replaying verifier could not decide), the event is
recorded, nothing moves and the challenge stays open for another resolution.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, cast

from dk.errors import FormatError
from dk.market import fields
from dk.market.accounts import acct
from dk.market.beacon import vstake
from dk.market.config import Context
from dk.market.errors import MarketRefused
from dk.market.ledger import Tx
from dk.market.requests import SignedRequest
from dk.market.results import pay_out

MAX_COUNTER_ROOTS = 4096


def bond(challenge_id: str) -> str:
    """Holder name of a challenge's bond."""
    return f"bond:{challenge_id}"


def first_disagreement(ours: list[str], theirs: list[str]) -> int | None:
    """Bisection to an interval whose start two transcripts share and whose end they do not.

    Args:
        ours: the worker's checkpoint roots, in order.
        theirs: the challenger's checkpoint roots, in order.

    Returns:
        The index ``i`` of interval ``i`` (checkpoint ``i`` → ``i+1``), or None when there is
        no such interval (the initial checkpoints differ, or the last common one agrees).
    """
    n = min(len(ours), len(theirs))
    if n < 2 or ours[0] != theirs[0] or ours[n - 1] == theirs[n - 1]:
        return None
    lo, hi = 0, n - 1  # invariant: agree at lo, differ at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ours[mid] == theirs[mid]:
            lo = mid
        else:
            hi = mid
    return lo


def order_workers(con: Any, order: Any) -> set[str]:
    """The accounts that worked on ``order``: its worker and, for a cluster order, every
    rank's (each is a worker on the order, SPEC V §14.2)."""
    from dk.market import cluster_flow

    return {order["worker"], *(r["worker"] for r in cluster_flow.ranks(con, order["order_id"]))}


def open_challenge(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Challenge an accepted order inside its window, locking the bond.

    Raises:
        FormatError: ``BAD_PARAMS``.
        MarketRefused: ``UNKNOWN_ORDER``, ``BAD_STATE``, ``WINDOW_CLOSED``, ``BOND_TOO_SMALL``,
            ``SELF_CHALLENGE``, ``INSUFFICIENT_FUNDS``.
    """
    p = req.params
    fields.only(p, {"order_id", "bond"}, {"interval", "counter_roots"})
    order_id = fields.object_id(p, "order_id", "o")
    amount = fields.amount(p, "bond")
    if ("interval" in p) == ("counter_roots" in p):
        raise FormatError(
            "market request: give exactly one of interval, counter_roots", reason="BAD_PARAMS"
        )
    interval = fields.integer(p, "interval", 0, 2**31) if "interval" in p else None
    counter = None
    if "counter_roots" in p:
        roots = p["counter_roots"]
        if not isinstance(roots, list) or not 2 <= len(roots) <= MAX_COUNTER_ROOTS:
            raise FormatError(
                f"market request: counter_roots must list 2..{MAX_COUNTER_ROOTS} roots",
                reason="BAD_PARAMS",
            )
        counter = [fields.digest_hex({"r": r}, "r") for r in roots]
    order = tx.one("SELECT * FROM orders WHERE order_id = ?", (order_id,))
    if order is None:
        raise MarketRefused("UNKNOWN_ORDER", f"no order {order_id}")
    if order["state"] != "accepted":
        raise MarketRefused("BAD_STATE", f"{order_id} is {order['state']}, not accepted")
    if not order["accepted_at"] <= now < order["window_end"]:
        raise MarketRefused("WINDOW_CLOSED", f"window of {order_id} is closed at {now}")
    if amount < ctx.config.min_bond:
        raise MarketRefused("BOND_TOO_SMALL", f"bond must be at least {ctx.config.min_bond}")
    if req.account in order_workers(tx.con, order):  # every rank of a cluster (SPEC V §14.2)
        raise MarketRefused("SELF_CHALLENGE", "a worker cannot challenge its own result")
    m = json.loads(order["policy"]).get("intervals")  # recorded by the verification (§10)
    if interval is not None and isinstance(m, int) and interval >= m:
        raise FormatError(  # a bond posted on no interval would be forfeited for nothing
            f"market request: {order_id} has {m} intervals, not an interval {interval}",
            reason="BAD_PARAMS",
        )
    cid = f"c{tx.seq}"
    tx.exec(
        "INSERT INTO challenges(challenge_id, order_id, challenger, bond, interval, counter,"
        " state, created) VALUES(?, ?, ?, ?, ?, ?, 'open', ?)",
        (
            cid,
            order_id,
            req.account,
            amount,
            interval,
            None if counter is None else json.dumps(counter),
            tx.seq,
        ),
    )
    tx.move(acct(req.account), bond(cid), amount)
    tx.data = {"challenge_id": cid, "order_id": order_id}


def disputed_interval(challenge: Any, manifest: dict[str, Any]) -> int | None:
    """The interval a challenge disputes, or None if it names no valid one.

    Raises:
        FormatError: if the manifest's checkpoint list is malformed.
    """
    checkpoints = manifest.get("checkpoints")
    if not isinstance(checkpoints, list) or not checkpoints:
        raise FormatError("bundle manifest has no checkpoints list")
    ours = [fields.digest_hex(c if isinstance(c, dict) else {}, "root") for c in checkpoints]
    if challenge["counter"] is None:
        index = int(challenge["interval"])
    else:
        found = first_disagreement(ours, json.loads(challenge["counter"]))
        if found is None:
            return None
        index = found
    return index if 0 <= index < len(ours) - 1 else None


def record_resolution(
    tx: Tx,
    challenge_id: str,
    interval: int | None,
    verdict: str,
    now: int,
    *,
    blame: list[int] | None = None,
) -> None:
    """Apply a challenge's outcome from the replay ``verdict`` of ``interval``.

    Upheld when the replay rejects; failed when it accepts or no valid interval is named;
    left open (nothing moves) when it is ``inconclusive``. ``blame``: the ranks the replay
    names; on a cluster order only their stakes go to the challenger (SPEC V §14.5).

    Raises:
        MarketRefused: ``UNKNOWN_CHALLENGE``, ``BAD_STATE``.
    """
    ch = tx.one("SELECT * FROM challenges WHERE challenge_id = ?", (challenge_id,))
    if ch is None:
        raise MarketRefused("UNKNOWN_CHALLENGE", f"no challenge {challenge_id}")
    if ch["state"] != "open":
        raise MarketRefused("BAD_STATE", f"{challenge_id} is already {ch['state']}")
    # A challenge's order exists (foreign key).
    order = cast(sqlite3.Row, tx.one("SELECT * FROM orders WHERE order_id = ?", (ch["order_id"],)))
    if interval is None:
        verdict = "accept"  # nothing to replay: the challenge names no disputed interval
    upheld = verdict == "reject"
    tx.data = {
        "challenge_id": challenge_id,
        "order_id": ch["order_id"],
        "interval": interval,
        "verdict": verdict,
        "upheld": upheld,
    }
    if verdict == "inconclusive":
        return
    if not upheld:
        tx.exec("UPDATE challenges SET state = 'failed' WHERE challenge_id = ?", (challenge_id,))
        tx.move(bond(challenge_id), acct(order["worker"]), ch["bond"])
        return
    tx.exec("UPDATE challenges SET state = 'upheld' WHERE challenge_id = ?", (challenge_id,))
    tx.exec(
        "UPDATE orders SET state = 'slashed', outcome = 'slashed' WHERE order_id = ?",
        (order["order_id"],),
    )
    tx.data["outcome"] = "slashed"
    tx.move(bond(challenge_id), acct(ch["challenger"]), ch["bond"])
    pay_out(tx, order, escrow_to=order["consumer"], stake_to=ch["challenger"], blame=blame or [])
    slashed = {}
    for v in json.loads(order["attesters"] or "[]"):
        held = tx.amount(vstake(v))
        if held:
            tx.move(vstake(v), acct(ch["challenger"]), held)
        slashed[v] = held
        tx.exec("UPDATE validators SET state = 'slashed' WHERE account = ?", (v,))
    tx.data["slashed_validators"] = slashed
    for other in tx.all(
        "SELECT * FROM challenges WHERE order_id = ? AND state = 'open'", (order["order_id"],)
    ):
        tx.exec(
            "UPDATE challenges SET state = 'voided' WHERE challenge_id = ?",
            (other["challenge_id"],),
        )
        tx.move(bond(other["challenge_id"]), acct(other["challenger"]), other["bond"])
    from dk.market.whistle import void_open

    voided = void_open(tx, order["order_id"])
    if voided:
        tx.data["voided_whistles"] = voided
