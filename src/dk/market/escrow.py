"""Settlement: release after the challenge window, refunds on expiry and timeout (spec §6).

``settle(order, now)`` is permissionless and deterministic; its outcome depends only on the
order's state and the market's own clock (never a party's):

| state                    | condition                                | escrow → | stake →  |
|--------------------------|------------------------------------------|----------|----------|
| accepted                 | ``now >= window_end``, no open challenge | worker   | worker   |
| open                     | ``now >= deadline``                      | consumer | —        |
| matched (nothing sent)   | ``now >= deadline``                      | consumer | consumer |
| submitted / verified     | ``now >= deadline``                      | consumer | worker   |

The escrow holds the price plus the verification fee the order locked (SPEC V §11). At
release the worker gets the price; of the fee, the part the verification used,
``due = fee * min(A, E) // E`` (``A`` intervals challenged, ``E = fee_intervals`` estimated),
is shared equally by the attesters (``due // attesters`` each); the rest, the excess of the
estimate, returns to the consumer. Every other outcome returns the whole escrow to the consumer.
"""

from __future__ import annotations

import json
from typing import Any

from dk.market.accounts import acct
from dk.market.errors import MarketRefused
from dk.market.ledger import Tx
from dk.market.orders import escrow, order_fee, stake
from dk.market.results import pay_out

TERMINAL = frozenset({"released", "expired", "timed_out", "rejected", "slashed", "cancelled"})


def settle_order(tx: Tx, order_id: str, now: int) -> None:
    """Apply the settlement rule that the order's state and ``now`` call for.

    Raises:
        MarketRefused: ``UNKNOWN_ORDER``, ``ALREADY_SETTLED``, ``NOT_SETTLEABLE`` (with why).
    """
    order = tx.one("SELECT * FROM orders WHERE order_id = ?", (order_id,))
    if order is None:
        raise MarketRefused("UNKNOWN_ORDER", f"no order {order_id}")
    state = order["state"]
    if state in TERMINAL:
        raise MarketRefused("ALREADY_SETTLED", f"{order_id} is already {state}")
    if state == "accepted":
        if now < order["window_end"]:
            raise MarketRefused(
                "NOT_SETTLEABLE", f"challenge window of {order_id} ends at {order['window_end']}"
            )
        if tx.one("SELECT 1 FROM challenges WHERE order_id = ? AND state = 'open'", (order_id,)):
            raise MarketRefused("NOT_SETTLEABLE", f"{order_id} has an unresolved challenge")
        if tx.one("SELECT 1 FROM whistles WHERE order_id = ? AND state = 'open'", (order_id,)):
            raise MarketRefused("NOT_SETTLEABLE", f"{order_id} has an unresolved whistle")
        tx.exec(
            "UPDATE orders SET state = 'released', outcome = 'released' WHERE order_id = ?",
            (order_id,),
        )
        tx.data.update(order_id=order_id, outcome="released", **release(tx, order))
        return
    elif now < order["deadline"]:
        raise MarketRefused(
            "NOT_SETTLEABLE", f"{order_id} is {state}; its deadline is {order['deadline']}"
        )
    elif state == "open":
        outcome, escrow_to, stake_to = "expired", order["consumer"], order["consumer"]
    elif state == "matched":
        outcome, escrow_to, stake_to = "timed_out", order["consumer"], order["consumer"]
    else:  # submitted or verified: the worker delivered, validators did not finish in time
        outcome, escrow_to, stake_to = "timed_out", order["consumer"], order["worker"]
    tx.exec(
        "UPDATE orders SET state = ?, outcome = ? WHERE order_id = ?", (outcome, outcome, order_id)
    )
    pay_out(tx, order, escrow_to=escrow_to, stake_to=stake_to, blame=None)
    if state == "open":
        from dk.market.profiles import refund_open

        refund_open(tx, order_id)
    tx.data.update(order_id=order_id, outcome=outcome)


def fee_due(fee: int, fee_intervals: int, challenged: int) -> int:
    """The part of a locked verification fee a verification of ``challenged`` intervals used."""
    return fee * min(challenged, fee_intervals) // fee_intervals if fee else 0


def release(tx: Tx, order: Any) -> dict[str, Any]:
    """Pay an accepted order out: the price to the worker, the fee due to the attesters, the
    excess to the consumer, the stake back to the worker (SPEC V §11)."""
    from dk.market import cluster_flow
    from dk.market.whistle import challenged

    oid = order["order_id"]
    held = tx.amount(escrow(oid))
    price = min(int(order["price"]), held)
    fee, estimated = order_fee(tx.con, oid)
    attesters = json.loads(order["attesters"] or "[]")
    due = fee_due(fee, estimated, len(challenged(tx.con, oid)))
    share = due // len(attesters) if attesters else 0
    if cluster_flow.world_size(tx.con, oid) > 1:
        # a cluster order: each rank its share of the price, and its stake back (SPEC V §14.5)
        price = cluster_flow.release_ranks(tx, order)
    elif price:
        tx.move(escrow(oid), acct(order["worker"]), price)
    paid = {}
    for v in attesters:
        if share:
            tx.move(escrow(oid), acct(v), share)
        paid[v] = share
    refund = tx.amount(escrow(oid))
    if refund:
        tx.move(escrow(oid), acct(order["consumer"]), refund)
    locked = tx.amount(stake(oid))
    if locked:
        tx.move(stake(oid), acct(order["worker"]), locked)
    return {"price": price, "fee": fee, "fee_paid": paid, "refund": refund}
