"""Settlement: release after the challenge window, refunds on expiry and timeout (spec §6).

``settle(order, now)`` is permissionless and deterministic; its outcome depends only on the
order's state and the market's own clock (never a party's):

| state                    | condition                                | escrow → | stake →  |
|--------------------------|------------------------------------------|----------|----------|
| accepted                 | ``now >= window_end``, no open challenge | worker   | worker   |
| open                     | ``now >= deadline``                      | consumer | —        |
| matched (nothing sent)   | ``now >= deadline``                      | consumer | consumer |
| submitted / verified     | ``now >= deadline``                      | consumer | worker   |
"""

from __future__ import annotations

from dk.market.errors import MarketRefused
from dk.market.ledger import Tx
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
        outcome, escrow_to, stake_to = "released", order["worker"], order["worker"]
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
    tx.data.update(order_id=order_id, outcome=outcome)
