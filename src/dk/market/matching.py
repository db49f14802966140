"""Matching: the consumer gets the best-priced bid meeting every condition (spec §4.3).

A bid is *eligible* for an order when it is open with capacity left, its price is at most the
order's ``max_price``, its per-job stake is at least ``min_stake``, it carries every tag of the
order with the same value, and its worker is not the consumer. Among eligible bids the lowest
price wins; ties go to the earlier bid (price-time priority).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from dk.market import fields
from dk.market.accounts import acct
from dk.market.beacon import draw_at_match
from dk.market.config import Context
from dk.market.errors import MarketRefused
from dk.market.ledger import Tx
from dk.market.orders import escrow, load_order, stake
from dk.market.profiles import fix_tolerance
from dk.market.requests import SignedRequest


def bid_problems(order: sqlite3.Row, bid: sqlite3.Row) -> list[str]:
    """Every condition of ``order`` that ``bid`` fails, as readable reason strings.

    Args:
        order: an ``orders`` row.
        bid: a ``bids`` row.

    Returns:
        An empty list when the bid is eligible; otherwise codes such as
        ``"PRICE_ABOVE_MAX (12 > 10)"`` or ``"TAG_MISMATCH region (eu != us)"``.
    """
    out: list[str] = []
    if bid["state"] != "open" or bid["remaining"] <= 0:
        out.append(f"NO_CAPACITY (bid is {bid['state']}, {bid['remaining']} left)")
    if bid["price"] > order["max_price"]:
        out.append(f"PRICE_ABOVE_MAX ({bid['price']} > {order['max_price']})")
    if bid["stake"] < order["min_stake"]:
        out.append(f"STAKE_BELOW_MIN ({bid['stake']} < {order['min_stake']})")
    want: dict[str, str] = json.loads(order["tags"])
    have: dict[str, str] = json.loads(bid["tags"])
    for key in sorted(want):
        if key not in have:
            out.append(f"TAG_MISSING {key} (order wants {want[key]})")
        elif have[key] != want[key]:
            out.append(f"TAG_MISMATCH {key} ({have[key]} != {want[key]})")
    if bid["worker"] == order["consumer"]:
        out.append("SELF_MATCH (worker is the consumer)")
    return out


def best_bid(con: sqlite3.Connection, order: sqlite3.Row) -> sqlite3.Row | None:
    """The eligible bid with the lowest ``(price, created)``, or None."""
    cur = con.execute(
        "SELECT * FROM bids WHERE state = 'open' AND remaining > 0 AND price <= ? AND stake >= ?"
        " ORDER BY price, created",
        (order["max_price"], order["min_stake"]),
    )
    for bid in cur:
        if not bid_problems(order, bid):
            return bid
    return None


def explain(con: sqlite3.Connection, order_id: str) -> list[dict[str, Any]]:
    """Why each bid did or did not match ``order_id`` (for ``dk market show``).

    Returns:
        One entry per bid in price-time order: ``{"bid_id", "price", "status", "reasons"}``
        with status ``matched``, ``eligible`` (would be next), ``outbid`` or ``ineligible``.

    Raises:
        MarketRefused: ``UNKNOWN_ORDER``.
    """
    order = con.execute("SELECT * FROM orders WHERE order_id = ?", (order_id,)).fetchone()
    if order is None:
        raise MarketRefused("UNKNOWN_ORDER", f"no order {order_id}")
    out: list[dict[str, Any]] = []
    winner = order["bid_id"]
    first_eligible: str | None = None
    for bid in con.execute("SELECT * FROM bids ORDER BY price, created"):
        entry: dict[str, Any] = {"bid_id": bid["bid_id"], "price": bid["price"], "reasons": []}
        if bid["bid_id"] == winner:
            entry["status"] = "matched"
        else:
            problems = bid_problems(order, bid)
            if problems:
                entry["status"], entry["reasons"] = "ineligible", problems
            elif winner is not None or first_eligible is not None:
                ahead = winner or first_eligible
                entry["status"] = "outbid"
                entry["reasons"] = [f"OUTBID by {ahead} (lower price, or same price earlier)"]
            else:
                entry["status"], first_eligible = "eligible", bid["bid_id"]
        out.append(entry)
    return out


def match(ctx: Context, tx: Tx, req: SignedRequest, now: int) -> None:
    """Match the signer's open order with the best eligible bid.

    The winning bid's per-job stake moves to ``stake:<order>``; the escrow above the bid's
    price returns to the consumer, so the escrow now holds exactly the price. The order's
    ``n`` validators are drawn in the same event (:func:`dk.market.beacon.draw_at_match`).

    Raises:
        MarketRefused: ``UNKNOWN_ORDER``, ``NOT_OWNER``, ``BAD_STATE``, ``DEADLINE_PASSED``,
            ``NO_MATCH``, ``NOT_ENOUGH_VALIDATORS``.
    """
    fields.only(req.params, {"order_id"})
    order_id = fields.object_id(req.params, "order_id", "o")
    order = load_order(tx, order_id, state="open", account=req.account, now=now)
    bid = best_bid(tx.con, order)
    if bid is None:
        raise MarketRefused("NO_MATCH", f"no bid meets every condition of {order_id}")
    chosen = draw_at_match(ctx, tx, order, bid["worker"], req.envelope["signature"])
    profiled = fix_tolerance(ctx, tx, order, bid["worker"])  # SPEC V §12
    left = bid["remaining"] - 1
    tx.exec(
        "UPDATE bids SET remaining = ?, state = ? WHERE bid_id = ?",
        (left, "open" if left else "filled", bid["bid_id"]),
    )
    tx.exec(
        "UPDATE orders SET state = 'matched', bid_id = ?, worker = ?, price = ?, stake = ?"
        " WHERE order_id = ?",
        (bid["bid_id"], bid["worker"], bid["price"], bid["stake"], order_id),
    )
    if bid["stake"]:
        tx.move(stake(bid["bid_id"]), stake(order_id), bid["stake"])
    change = order["max_price"] - bid["price"]
    if change:
        tx.move(escrow(order_id), acct(req.account), change)
    tx.data = {
        "order_id": order_id,
        "bid_id": bid["bid_id"],
        "worker": bid["worker"],
        "price": bid["price"],
        "validators": chosen,
    }
    if profiled is not None:
        tx.data.update(profiled)
