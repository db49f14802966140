"""Cluster orders on the ledger: rank slots at match, shares at verification, split payment
and per-rank slashing (SPEC Part V §14).

An order with ``world_size = W > 1`` has a row in ``clusters`` and, once matched, ``W`` rows
in ``ranks``. Each rank's stake is held in ``stake:<order>:r<rank>``; the order's escrow holds
the whole price. Rank 0 is the order's ``worker``: it submits and signs the manifest. An
order with ``W = 1`` never touches this module's tables and follows Part V §4–§6 unchanged.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from dk.errors import FormatError
from dk.market import cluster, fields, matching
from dk.market.accounts import acct
from dk.market.beacon import draw_at_match
from dk.market.config import Context
from dk.market.errors import MarketRefused
from dk.market.ledger import Tx
from dk.market.orders import escrow, load_order
from dk.market.requests import SignedRequest


def rank_stake(order_id: str, rank: int) -> str:
    """Holder of rank ``rank``'s locked stake for a cluster order."""
    return f"stake:{order_id}:r{rank}"


def world_size(con: Any, order_id: str) -> int:
    """The order's ``W`` (1 for an ordinary order). ``con`` is a connection or a :class:`Tx`."""
    row = con.execute("SELECT world_size FROM clusters WHERE order_id = ?", (order_id,)).fetchone()
    return int(row[0]) if row else 1


def ranks(con: Any, order_id: str) -> list[dict[str, Any]]:
    """The order's rank slots in rank order (empty before the match or for ``W = 1``)."""
    cur = con.execute(
        "SELECT slot, bid_id, worker, price, stake, share, paid, outcome FROM ranks"
        " WHERE order_id = ? ORDER BY slot",
        (order_id,),
    )
    names = ("rank", "bid_id", "worker", "price", "stake", "share", "paid", "outcome")
    return [dict(zip(names, tuple(r), strict=True)) for r in cur]


def match(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """The ``match`` action: an ordinary order goes to :func:`dk.market.matching.match`; a
    cluster order fills its ``W`` rank slots from standing bids (SPEC V §14.2).

    Rank ``r`` is the ``r``-th bid, in price-time order, among the eligible bids of distinct
    workers, where eligible is §4.3's rule with ``max_price // W`` as the price bound. The
    price is uniform: ``W`` times the highest chosen bid price, so every rank earns at least
    its bid. Each rank's per-job stake moves to its own holder; the escrow above the price
    returns to the consumer; the validators are drawn with every rank's worker excluded.

    Raises:
        MarketRefused: ``UNKNOWN_ORDER``, ``NOT_OWNER``, ``BAD_STATE``, ``DEADLINE_PASSED``,
            ``NO_MATCH``, ``NOT_ENOUGH_VALIDATORS``.
    """
    fields.only(req.params, {"order_id"})
    order_id = fields.object_id(req.params, "order_id", "o")
    size = world_size(tx.con, order_id)
    if size == 1:
        matching.match(ctx, tx, req, now)
        return
    order = load_order(tx, order_id, state="open", account=req.account, now=now)
    slot_bound = dict(order) | {"max_price": order["max_price"] // size}
    chosen: list[sqlite3.Row] = []
    for bid in tx.all(
        "SELECT * FROM bids WHERE state = 'open' AND remaining > 0 AND price <= ? AND stake >= ?"
        " ORDER BY price, created",
        (slot_bound["max_price"], order["min_stake"]),
    ):
        if bid["worker"] in {b["worker"] for b in chosen}:
            continue
        if not matching.bid_problems(slot_bound, bid):  # type: ignore[arg-type]
            chosen.append(bid)
            if len(chosen) == size:
                break
    if len(chosen) < size:
        raise MarketRefused(
            "NO_MATCH",
            f"{len(chosen)} distinct workers' bids meet every condition of {order_id}, "
            f"its cluster needs {size}",
        )
    workers = [b["worker"] for b in chosen]
    validators = draw_at_match(
        ctx, tx, order, workers[0], req.envelope["signature"], also=workers[1:]
    )
    slot_price = max(b["price"] for b in chosen)
    price = size * slot_price
    for r, bid in enumerate(chosen):
        left = bid["remaining"] - 1
        tx.exec(
            "UPDATE bids SET remaining = ?, state = ? WHERE bid_id = ?",
            (left, "open" if left else "filled", bid["bid_id"]),
        )
        tx.exec(
            "INSERT INTO ranks(order_id, slot, bid_id, worker, price, stake)"
            " VALUES(?, ?, ?, ?, ?, ?)",
            (order_id, r, bid["bid_id"], bid["worker"], bid["price"], bid["stake"]),
        )
        if bid["stake"]:
            tx.move(f"stake:{bid['bid_id']}", rank_stake(order_id, r), bid["stake"])
    tx.exec(
        "UPDATE orders SET state = 'matched', bid_id = ?, worker = ?, price = ?, stake = ?"
        " WHERE order_id = ?",
        # stake: W x the smallest rank stake, the deterrent of the weakest rank scaled to
        # the whole price (SPEC V §14.2; the economic rule of §10 is homogeneous in S and P)
        (chosen[0]["bid_id"], workers[0], price, size * min(b["stake"] for b in chosen),
         order_id),
    )  # fmt: skip
    if order["max_price"] > price:
        tx.move(escrow(order_id), acct(req.account), order["max_price"] - price)
    tx.data = {
        "order_id": order_id,
        "bid_id": chosen[0]["bid_id"],
        "worker": workers[0],
        "price": price,
        "validators": validators,
        "world_size": size,
        "slot_price": slot_price,
        "ranks": [
            {"rank": r, "bid_id": b["bid_id"], "worker": b["worker"], "price": b["price"],
             "stake": b["stake"]}
            for r, b in enumerate(chosen)
        ],
    }  # fmt: skip


def check_bundle(con: Any, order: Any, manifest: dict[str, Any], job: Any) -> None:
    """A cluster order's bundle must be the job's ``W`` and list the assigned workers, each
    of whom signed the transcript root (SPEC V §14.4). Checked before any verdict, so no
    rank can be blamed for a bundle it did not sign.

    Raises:
        MarketRefused: ``JOB_MISMATCH`` (the job's ``world_size`` is not the order's),
            ``BUNDLE_MISMATCH``.
    """
    size = world_size(con, order["order_id"])
    if cluster.job_world_size(job) != size:
        raise MarketRefused(
            "JOB_MISMATCH",
            f"the job's train.world_size is {cluster.job_world_size(job)}, the order's {size}",
        )
    if size == 1:
        return
    check_ranks(con, order, manifest)


def check_ranks(con: Any, order: Any, manifest: dict[str, Any]) -> None:
    """A cluster bundle lists the order's rank workers in rank order, each of whom signed the
    transcript root (SPEC V §14.4).

    Raises:
        MarketRefused: ``BUNDLE_MISMATCH``.
    """
    try:
        keys, _ = cluster.manifest_ranks(manifest)
        bad = cluster.bad_rank_signatures(manifest)
    except FormatError as e:
        raise MarketRefused("BUNDLE_MISMATCH", f"the bundle's ranks: {e}") from None
    if keys != [r["worker"] for r in ranks(con, order["order_id"])]:
        raise MarketRefused("BUNDLE_MISMATCH", "the bundle's ranks are not the order's workers")
    if bad:
        raise MarketRefused(
            "BUNDLE_MISMATCH", f"rank {bad[0]} did not sign the bundle's transcript root"
        )


class _Inconclusive:
    """A report whose blame the market cannot read: treated as the verifier's own failure."""

    verdict = "inconclusive"
    ok = False

    def __init__(self, report: Any) -> None:
        self._report = report

    @property
    def codes(self) -> list[str]:
        inner = getattr(self._report, "codes", None)
        if inner is None:
            inner = [getattr(r, "code", r) for r in getattr(self._report, "reasons", [])]
        return [*map(str, inner), "BAD_BLAME"]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._report, name)


def judge(con: Any, order_id: str, result: Any) -> tuple[Any, list[int]]:
    """``(result, blame)`` for a cluster order: a result whose ``blame`` is malformed becomes
    inconclusive (nothing moves: never a worker's fault). ``W = 1``: ``(result, [])``."""
    size = world_size(con, order_id)
    if size == 1 or result is None:
        return result, []
    blame = cluster.blame_of(result, size)
    if blame is None:
        return _Inconclusive(result), []
    return result, blame


def record_shares(tx: Tx, order_id: str, job: Any) -> None:
    """On an accepting verification of a cluster order, fix each rank's share of the price
    from the job's global batch (SPEC V §14.3) and record them in the ``verify`` event."""
    size = world_size(tx.con, order_id)
    if size == 1 or tx.data.get("verdict") != "accept":
        return
    row = tx.one("SELECT price FROM orders WHERE order_id = ?", (order_id,))
    assert row is not None  # verified just now in this transaction
    batch = cluster.job_batch_size(job)
    shares = cluster.rank_shares(int(row["price"]), size, batch)
    tx.exec("UPDATE clusters SET batch_size = ? WHERE order_id = ?", (batch, order_id))
    for r, share in enumerate(shares):
        tx.exec("UPDATE ranks SET share = ? WHERE order_id = ? AND slot = ?", (share, order_id, r))
    tx.data.update(batch_size=batch, shares=shares)


def pay_out(tx: Tx, order: Any, *, escrow_to: str, stake_to: str, blame: list[int] | None) -> None:
    """Empty a cluster order's escrow and rank stakes (SPEC V §14.5).

    ``escrow_to == order["worker"]`` (release) pays each rank its recorded share
    (:func:`release_ranks`); otherwise the whole escrow goes to ``escrow_to``.
    ``stake_to == order["worker"]`` returns every rank its own stake; otherwise the stakes of
    :func:`dk.market.cluster.guilty_ranks` go to ``stake_to`` and the others return to their
    workers. Records ``ranks_out`` (and ``blame`` when a rank is guilty) in the event.
    """
    oid = order["order_id"]
    if escrow_to == order["worker"] and stake_to == order["worker"]:
        release_ranks(tx, order)
        if tx.amount(escrow(oid)):
            raise RuntimeError(f"{oid}: the recorded shares do not add up to the escrow")
        return
    held = tx.amount(escrow(oid))
    if held:
        tx.move(escrow(oid), acct(escrow_to), held)
    slots = ranks(tx.con, oid)
    guilty = set() if stake_to == order["worker"] else set(cluster.guilty_ranks(blame, len(slots)))
    _stakes_out(tx, oid, slots, {r["rank"]: 0 for r in slots}, guilty, stake_to)
    if guilty:
        tx.data["blame"] = blame


def release_ranks(tx: Tx, order: Any) -> int:
    """Pay each rank of an accepted cluster order its share out of the escrow and return
    every rank its stake (SPEC V §14.5). Returns the total paid (the price); anything else
    the escrow holds is left to the caller. Records ``ranks_out`` in the event."""
    oid = order["order_id"]
    slots = ranks(tx.con, oid)
    if any(r["share"] is None for r in slots):
        raise RuntimeError(f"{oid}: no shares recorded (the order was never verified)")
    for r in slots:
        if r["share"]:
            tx.move(escrow(oid), acct(r["worker"]), r["share"])
    _stakes_out(tx, oid, slots, {r["rank"]: r["share"] for r in slots}, set(), "")
    return sum(r["share"] for r in slots)


def _stakes_out(
    tx: Tx, oid: str, slots: list[dict[str, Any]], paid: dict[int, int], guilty: set[int], to: str
) -> None:
    out = []
    for r in slots:
        dst = to if r["rank"] in guilty else r["worker"]
        amount = tx.amount(rank_stake(oid, r["rank"]))
        if amount:
            tx.move(rank_stake(oid, r["rank"]), acct(dst), amount)
        outcome = "slashed" if r["rank"] in guilty else "returned"
        tx.exec(
            "UPDATE ranks SET paid = ?, outcome = ? WHERE order_id = ? AND slot = ?",
            (paid[r["rank"]], outcome, oid, r["rank"]),
        )
        out.append({"rank": r["rank"], "paid": paid[r["rank"]], "stake": amount, "stake_to": dst})
    tx.data["ranks_out"] = out


def show(con: Any, order_id: str, bids: list[dict[str, Any]]) -> dict[str, Any]:
    """``dk market show`` additions for a cluster order: ``world_size``, the rank slots (with
    each stake still held), and each chosen bid marked ``matched`` with its rank."""
    size = world_size(con, order_id)
    if size == 1:
        return {}
    slots = ranks(con, order_id)
    for r in slots:
        row = con.execute(
            "SELECT amount FROM holdings WHERE holder = ?", (rank_stake(order_id, r["rank"]),)
        ).fetchone()
        r["locked_stake"] = int(row[0]) if row else 0
    by_bid = {r["bid_id"]: r["rank"] for r in slots}
    for b in bids:
        if b["bid_id"] in by_bid:
            b.update(status="matched", rank=by_bid[b["bid_id"]], reasons=[])
    row = con.execute("SELECT batch_size FROM clusters WHERE order_id = ?", (order_id,)).fetchone()
    return {"world_size": size, "batch_size": row[0], "ranks": slots}
