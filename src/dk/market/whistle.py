"""Whistleblowers: anyone with a deposit re-checks an attested verification and disputes an
attestation that was wrong (SPEC Part V §13).

The attesters of an accepted order vouched, with their stake, that the market's report is
right: the order's beacon derived the challenged intervals (recorded with the verification)
and each of them replays. A whistleblower re-runs the same verification with the recorded
beacon (:func:`recheck`, on its own machine) and, if a challenged interval does not replay,
posts ``whistle(order_id, interval, deposit)`` inside the challenge window.

Who decides: the market, exactly as for a challenge (SPEC V §6): ``resolve_whistle`` replays
that one interval of the committed bundle (``replay_interval`` at the order's tolerance).

* ``reject``: the whistle is **true**. The attesters signed a report whose own challenge
  fails: each attester's whole stake is slashed to the whistleblower (it becomes ``slashed``);
  the worker's stake for the order goes to the whistleblower (on a cluster order only the
  blamed ranks' stakes, rank 0's when the replay names none: SPEC V §14.5), the escrow back
  to the consumer (outcome ``slashed``); the deposit returns; if the slashed stakes come to
  less than ``whistle_payout`` the treasury pays the difference, as far as it holds. Other open
  challenges and whistles of the order are voided (bonds and deposits returned).
* ``accept`` (or an interval the recorded challenge does not hold): the whistle is **false**
  and its deposit goes to the treasury (not to the attesters: a false whistle must not be a
  way to pay a validator).
* ``inconclusive``: recorded, nothing moves, the whistle stays open.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dk.market import fields
from dk.market.accounts import acct
from dk.market.beacon import vstake
from dk.market.config import Context
from dk.market.errors import MarketRefused
from dk.market.ledger import Tx
from dk.market.requests import SignedRequest
from dk.market.treasury import forfeit, top_up


def deposit_holder(whistle_id: str) -> str:
    """Holder name of a whistle's deposit."""
    return f"wdeposit:{whistle_id}"


def challenged(tx_or_con: Any, order_id: str) -> list[int]:
    """The intervals the order's accepted verification challenged (empty if none recorded)."""
    row = tx_or_con.execute(
        "SELECT challenged FROM verdicts WHERE order_id = ?", (order_id,)
    ).fetchone()
    return [int(i) for i in json.loads(row[0])] if row else []


def open_whistle(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Dispute an accepted order's attestations on one challenged interval, locking a deposit.

    Raises:
        FormatError: ``BAD_PARAMS``.
        MarketRefused: ``UNKNOWN_ORDER``, ``BAD_STATE``, ``WINDOW_CLOSED``,
            ``DEPOSIT_TOO_SMALL``, ``SELF_CHALLENGE``, ``NOT_CHALLENGED``,
            ``INSUFFICIENT_FUNDS``.
    """
    p = req.params
    fields.only(p, {"order_id", "interval", "deposit"})
    order_id = fields.object_id(p, "order_id", "o")
    interval = fields.integer(p, "interval", 0, 2**31)
    amount = fields.amount(p, "deposit")
    order = tx.one("SELECT * FROM orders WHERE order_id = ?", (order_id,))
    if order is None:
        raise MarketRefused("UNKNOWN_ORDER", f"no order {order_id}")
    if order["state"] != "accepted":
        raise MarketRefused("BAD_STATE", f"{order_id} is {order['state']}, not accepted")
    if not order["accepted_at"] <= now < order["window_end"]:
        raise MarketRefused("WINDOW_CLOSED", f"window of {order_id} is closed at {now}")
    if amount < ctx.config.whistle_deposit:
        raise MarketRefused(
            "DEPOSIT_TOO_SMALL", f"a whistle deposits at least {ctx.config.whistle_deposit}"
        )
    attesters = json.loads(order["attesters"] or "[]")
    from dk.market.challenges import order_workers

    if req.account in order_workers(tx.con, order) or req.account in attesters:
        raise MarketRefused(
            "SELF_CHALLENGE", "the worker and the attesters cannot whistle on their own result"
        )
    if interval not in challenged(tx.con, order_id):
        raise MarketRefused(
            "NOT_CHALLENGED",
            f"interval {interval} is not in {order_id}'s attested challenge (use a challenge)",
        )
    wid = f"w{tx.seq}"
    tx.exec(
        "INSERT INTO whistles(whistle_id, order_id, whistler, deposit, interval, state, created)"
        " VALUES(?, ?, ?, ?, ?, 'open', ?)",
        (wid, order_id, req.account, amount, interval, tx.seq),
    )
    tx.move(acct(req.account), deposit_holder(wid), amount)
    tx.data = {"whistle_id": wid, "order_id": order_id, "interval": interval, "deposit": amount}


def void_open(tx: Tx, order_id: str, *, keep: str | None = None) -> list[str]:
    """Void the order's other open whistles, returning their deposits; their ids."""
    voided = []
    for w in tx.all(
        "SELECT * FROM whistles WHERE order_id = ? AND state = 'open' ORDER BY created",
        (order_id,),
    ):
        if w["whistle_id"] == keep:
            continue
        tx.exec("UPDATE whistles SET state = 'voided' WHERE whistle_id = ?", (w["whistle_id"],))
        held = tx.amount(deposit_holder(w["whistle_id"]))
        if held:
            tx.move(deposit_holder(w["whistle_id"]), acct(w["whistler"]), held)
        voided.append(w["whistle_id"])
    return voided


def _guilty_stake(tx: Tx, order_id: str, blame: list[int] | None) -> int:
    """What a true whistle takes from the worker side: the order's stake, or on a cluster
    order (SPEC V §14.5) the stakes of the guilty ranks (the blamed ones, else rank 0)."""
    from dk.market import cluster, cluster_flow
    from dk.market.orders import stake

    size = cluster_flow.world_size(tx.con, order_id)
    if size == 1:
        return tx.amount(stake(order_id))
    guilty = cluster.guilty_ranks(blame or [], size)
    return sum(tx.amount(cluster_flow.rank_stake(order_id, r)) for r in guilty)


def record_whistle(
    ctx: Context,
    tx: Tx,
    whistle_id: str,
    verdict: str,
    now: int,
    *,
    blame: list[int] | None = None,
) -> None:
    """Apply a whistle's outcome from the replay ``verdict`` of its interval (SPEC V §13.2).

    ``blame``: the ranks the replay names; on a cluster order a true whistle takes only the
    guilty ranks' stakes (the blamed ranks, rank 0 when none is named), as a challenge does
    (SPEC V §14.5); the other ranks get theirs back.

    Raises:
        MarketRefused: ``UNKNOWN_WHISTLE``, ``BAD_STATE``.
    """
    from dk.market.challenges import bond
    from dk.market.results import pay_out

    w = tx.one("SELECT * FROM whistles WHERE whistle_id = ?", (whistle_id,))
    if w is None:
        raise MarketRefused("UNKNOWN_WHISTLE", f"no whistle {whistle_id}")
    if w["state"] != "open":
        raise MarketRefused("BAD_STATE", f"{whistle_id} is already {w['state']}")
    order = tx.one("SELECT * FROM orders WHERE order_id = ?", (w["order_id"],))
    if order is None or order["state"] != "accepted":
        raise MarketRefused("BAD_STATE", f"{w['order_id']} is no longer accepted")
    upheld = verdict == "reject"
    tx.data = {
        "whistle_id": whistle_id,
        "order_id": w["order_id"],
        "whistler": w["whistler"],
        "interval": w["interval"],
        "verdict": verdict,
        "upheld": upheld,
    }
    if verdict == "inconclusive":
        return
    holder, whistler = deposit_holder(whistle_id), w["whistler"]
    if not upheld:
        tx.exec("UPDATE whistles SET state = 'failed' WHERE whistle_id = ?", (whistle_id,))
        forfeit(tx, holder, tx.amount(holder))
        tx.data["forfeited"] = int(w["deposit"])
        return
    tx.exec("UPDATE whistles SET state = 'upheld' WHERE whistle_id = ?", (whistle_id,))
    tx.exec(
        "UPDATE orders SET state = 'slashed', outcome = 'slashed' WHERE order_id = ?",
        (order["order_id"],),
    )
    tx.data["outcome"] = "slashed"
    tx.move(holder, acct(whistler), tx.amount(holder))
    worker_stake = _guilty_stake(tx, order["order_id"], blame)
    pay_out(tx, order, escrow_to=order["consumer"], stake_to=whistler, blame=blame or [])
    slashed: dict[str, int] = {}
    for v in json.loads(order["attesters"] or "[]"):
        held = tx.amount(vstake(v))
        if held:
            tx.move(vstake(v), acct(whistler), held)
        slashed[v] = held
        tx.exec("UPDATE validators SET state = 'slashed' WHERE account = ?", (v,))
    reward = worker_stake + sum(slashed.values())
    paid = top_up(tx, whistler, ctx.config.whistle_payout - reward)
    tx.data.update(
        slashed_validators=slashed,
        worker_stake=worker_stake,
        top_up=paid,
        reward=reward + paid,
    )
    for other in tx.all(
        "SELECT * FROM challenges WHERE order_id = ? AND state = 'open'", (order["order_id"],)
    ):
        tx.exec(
            "UPDATE challenges SET state = 'voided' WHERE challenge_id = ?",
            (other["challenge_id"],),
        )
        tx.move(bond(other["challenge_id"]), acct(other["challenger"]), other["bond"])
    tx.data["voided"] = void_open(tx, order["order_id"], keep=whistle_id)


def recheck(
    market: Any, order_id: str, bundle_dir: str | Path, job: Any, *, verify: Any = None
) -> dict[str, Any]:
    """Re-run an accepted order's attested verification with its recorded beacon (the
    whistleblower's check, on its own machine).

    Returns:
        ``{"order_id", "verdict", "report_digest", "attested_digest", "matches",
        "challenged", "failing"}``: ``failing`` lists the challenged intervals whose replay
        failed (a whistle on any of them is true if the market's replay agrees).

    Raises:
        MarketRefused: ``BAD_STATE`` if the order was never verified.
    """
    from dk.market.profiles import verify_options

    order = market.order(order_id)
    if not order["report_digest"] or not order["beacon"]:
        raise MarketRefused("BAD_STATE", f"{order_id} has no recorded verification")
    run = verify or market.verifier
    report = run(Path(bundle_dir), job, **verify_options(order))
    from dk.market.results import verdict_of

    failing = sorted(
        {
            int(r.interval)
            for r in getattr(report, "reasons", [])
            if getattr(r, "interval", None) is not None
        }
    )
    digest = bytes(report.digest()).hex()
    return {
        "order_id": order_id,
        "verdict": verdict_of(report),
        "report_digest": digest,
        "attested_digest": order["report_digest"],
        "matches": digest == order["report_digest"],
        "challenged": list(getattr(report, "challenged", [])),
        "failing": failing,
    }


def whistle_request(
    market: Any,
    client: Any,
    order_id: str,
    deposit: int,
    *,
    interval: int | None = None,
    bundle_dir: str | Path | None = None,
    job: Any = None,
    verify: Any = None,
) -> dict[str, Any]:
    """A signed ``whistle`` request: on ``interval``, or on the first challenged interval that
    this machine's :func:`recheck` of ``bundle_dir`` finds failing.

    Raises:
        MarketRefused: ``NOTHING_TO_WHISTLE`` when the re-check finds every challenged
            interval replaying (a whistle would only lose its deposit).
    """
    if interval is None:
        if bundle_dir is None or job is None:
            raise ValueError("give an interval, or a bundle and its job to re-check")
        found = recheck(market, order_id, bundle_dir, job, verify=verify)
        failing = [i for i in found["failing"] if i in found["challenged"]]
        if not failing:
            raise MarketRefused(
                "NOTHING_TO_WHISTLE",
                f"the re-check of {order_id} is {found['verdict']}: every challenged interval "
                "replays, so a whistle would lose its deposit",
            )
        interval = failing[0]
    return client.request("whistle", order_id=order_id, interval=interval, deposit=deposit)
