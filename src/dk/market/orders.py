"""Orders (consumers) and bids (workers): placing locks money, cancelling returns it (spec §4.2).

An order locks its ``max_price`` plus its verification ``fee`` (SPEC V §11) in
``escrow:<order>`` when placed; a bid locks ``stake * capacity`` in ``stake:<bid>``. Only the
owner may cancel, and only while open.
"""

from __future__ import annotations

import json
from typing import Any

from dk.errors import FormatError
from dk.market import cluster, fields
from dk.market.accounts import acct
from dk.market.config import Context
from dk.market.errors import MarketRefused
from dk.market.ledger import Tx
from dk.market.requests import SignedRequest

MAX_CAPACITY = 1000


def escrow(order_id: str) -> str:
    """Holder name of an order's escrowed payment."""
    return f"escrow:{order_id}"


def stake(owner_id: str) -> str:
    """Holder name of a bid's (or a matched order's) locked worker stake."""
    return f"stake:{owner_id}"


def place_order(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Open an order for ``job_id`` and lock ``max_price`` (and the optional verification
    ``fee`` for ``fee_intervals`` challenged intervals, SPEC V §11) in escrow.

    Raises:
        FormatError: ``BAD_PARAMS``.
        MarketRefused: ``INSUFFICIENT_FUNDS``, ``DEADLINE_PASSED``.
    """
    p = req.params
    fields.only(
        p,
        {"job_id", "max_price", "min_stake", "deadline"},
        {"policy", "tags", "fee", "fee_intervals", "world_size"},
    )
    job_id = fields.digest_hex(p, "job_id")
    max_price = fields.amount(p, "max_price")
    min_stake = fields.integer(p, "min_stake")
    deadline = fields.integer(p, "deadline", 0, 2**62)
    policy = fields.policy(p, ctx.config.policy_defaults())
    tags = fields.tags(p)
    fee = _fee(p)
    if policy["profiles"] and policy["profiles"] < ctx.config.min_profiles:
        raise FormatError(
            f"market request: policy profiles must be 0 or at least {ctx.config.min_profiles}",
            reason="BAD_PARAMS",
        )
    world_size = cluster.world_size_param(p)
    if deadline <= now:
        raise MarketRefused("DEADLINE_PASSED", f"deadline {deadline} is not after now {now}")
    order_id = f"o{tx.seq}"
    tx.exec(
        "INSERT INTO orders(order_id, consumer, job_id, max_price, min_stake, deadline, policy,"
        " tags, state, created) VALUES(?, ?, ?, ?, ?, ?, ?, ?, 'open', ?)",
        (
            order_id,
            req.account,
            job_id,
            max_price,
            min_stake,
            deadline,
            json.dumps(policy, sort_keys=True),
            json.dumps(tags, sort_keys=True),
            tx.seq,
        ),
    )
    tx.move(acct(req.account), escrow(order_id), max_price)
    tx.data = {"order_id": order_id, "job_id": job_id, "policy": policy}
    if world_size > 1:  # a cluster order (SPEC V §14)
        tx.exec("INSERT INTO clusters(order_id, world_size) VALUES(?, ?)", (order_id, world_size))
        tx.data["world_size"] = world_size
    if fee is not None:
        tx.exec("INSERT INTO fees(order_id, fee, fee_intervals) VALUES(?, ?, ?)", (order_id, *fee))
        tx.move(acct(req.account), escrow(order_id), fee[0])
        tx.data.update(fee=fee[0], fee_intervals=fee[1])


def _fee(p: dict[str, Any]) -> tuple[int, int] | None:
    if ("fee" in p) != ("fee_intervals" in p):
        raise FormatError(
            "market request: give both fee and fee_intervals, or neither", reason="BAD_PARAMS"
        )
    if "fee" not in p:
        return None
    return fields.amount(p, "fee"), fields.integer(p, "fee_intervals", 1, 2**31)


def order_fee(con: Any, order_id: str) -> tuple[int, int]:
    """``(fee, fee_intervals)`` an order locked for its verification (``(0, 0)``: none)."""
    row = con.execute(
        "SELECT fee, fee_intervals FROM fees WHERE order_id = ?", (order_id,)
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def place_bid(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Offer ``capacity`` jobs at ``price`` each, locking ``stake`` per job.

    Raises:
        FormatError: ``BAD_PARAMS``.
        MarketRefused: ``INSUFFICIENT_FUNDS``.
    """
    p = req.params
    fields.only(p, {"price", "capacity", "stake"}, {"tags"})
    price = fields.amount(p, "price")
    capacity = fields.integer(p, "capacity", 1, MAX_CAPACITY)
    per_job = fields.integer(p, "stake", 0, (2**62 - 1) // MAX_CAPACITY)
    tags = fields.tags(p)
    bid_id = f"b{tx.seq}"
    tx.exec(
        "INSERT INTO bids(bid_id, worker, price, capacity, remaining, stake, tags, state, created)"
        " VALUES(?, ?, ?, ?, ?, ?, ?, 'open', ?)",
        (
            bid_id,
            req.account,
            price,
            capacity,
            capacity,
            per_job,
            json.dumps(tags, sort_keys=True),
            tx.seq,
        ),
    )
    if per_job:
        tx.move(acct(req.account), stake(bid_id), per_job * capacity)
    tx.data = {"bid_id": bid_id}


def load_order(
    tx: Tx,
    order_id: str,
    *,
    state: str,
    account: str | None = None,
    role: str = "consumer",
    now: int | None = None,
) -> Any:
    """An order row, refused unless it exists, is in ``state``, belongs to ``account`` in
    ``role`` (``consumer`` or ``worker``) and, with ``now``, is before its deadline.

    Raises:
        MarketRefused: ``UNKNOWN_ORDER``, ``NOT_OWNER``, ``BAD_STATE``, ``DEADLINE_PASSED``.
    """
    order = tx.one("SELECT * FROM orders WHERE order_id = ?", (order_id,))
    if order is None:
        raise MarketRefused("UNKNOWN_ORDER", f"no order {order_id}")
    if account is not None and order[role] != account:
        whose = (
            "belongs to another account" if role == "consumer" else "was matched to another worker"
        )
        raise MarketRefused("NOT_OWNER", f"{order_id} {whose}")
    if order["state"] != state:
        raise MarketRefused("BAD_STATE", f"{order_id} is {order['state']}, not {state}")
    if now is not None and now >= order["deadline"]:
        raise MarketRefused("DEADLINE_PASSED", f"{order_id} expired at {order['deadline']}")
    return order


def cancel_order(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Cancel one of the signer's open orders and refund its escrow.

    Raises:
        MarketRefused: ``UNKNOWN_ORDER``, ``NOT_OWNER``, ``BAD_STATE``.
    """
    fields.only(req.params, {"order_id"})
    order_id = fields.object_id(req.params, "order_id", "o")
    load_order(tx, order_id, state="open", account=req.account)
    refund = tx.amount(escrow(order_id))
    tx.exec(
        "UPDATE orders SET state = 'cancelled', outcome = 'cancelled' WHERE order_id = ?",
        (order_id,),
    )
    tx.move(escrow(order_id), acct(req.account), refund)
    from dk.market.profiles import refund_open

    refund_open(tx, order_id)
    tx.data = {"order_id": order_id, "outcome": "cancelled"}


def cancel_bid(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Close one of the signer's bids and return the stake of its unused capacity.

    Raises:
        MarketRefused: ``UNKNOWN_BID``, ``NOT_OWNER``, ``BAD_STATE``.
    """
    fields.only(req.params, {"bid_id"})
    bid_id = fields.object_id(req.params, "bid_id", "b")
    row = tx.one("SELECT worker, state FROM bids WHERE bid_id = ?", (bid_id,))
    if row is None:
        raise MarketRefused("UNKNOWN_BID", f"no bid {bid_id}")
    if row["worker"] != req.account:
        raise MarketRefused("NOT_OWNER", f"{bid_id} belongs to another account")
    if row["state"] != "open":
        raise MarketRefused("BAD_STATE", f"{bid_id} is {row['state']}, not open")
    tx.exec("UPDATE bids SET state = 'closed', remaining = 0 WHERE bid_id = ?", (bid_id,))
    left = tx.amount(stake(bid_id))
    if left:
        tx.move(stake(bid_id), acct(req.account), left)
    tx.data = {"bid_id": bid_id, "returned": left}
