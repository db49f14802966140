"""Validator draw and the challenge beacon (spec Part V §5.1, §5.3).

At match time the market draws the order's ordered validator set from the registered,
staked validators::

    seed_r = H("dk/v1/market/draw", market_id || prev_head || u64(len(order_id)) || order_id
                                    || u64(r) || entropy_r)

where ``prev_head`` is the ledger head before the drawing event, ``r`` the draw round (0 at
match, +1 per redraw) and ``entropy_0`` the consumer's Ed25519 signature on its ``match``
request (``entropy_r`` is empty for ``r > 0``). The pool is the eligible accounts sorted
ascending; the set is the first entries of the partial Fisher–Yates shuffle
``sample_without_replacement(stream_key("market-draw", 0, seed_r), len(pool), count)``.

After the worker's ``submit`` each drawn validator posts a ``beacon_share``: its BLS signature
on ``H("dk/v1/market/beacon-share", market_id || u64(len(order_id)) || order_id ||
transcript_root || manifest_digest)``. When every member of the set has posted, the beacon is
``H("dk/v1/market/beacon", Aggregate(shares))``. BLS signatures are unique, so nobody without
every drawn secret key can predict or change it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from dk.crypto.hashing import tagged_hash, u64
from dk.crypto.stream import sample_without_replacement, stream_key
from dk.market.accounts import acct
from dk.market.config import Context, MarketConfig
from dk.market.errors import MarketRefused
from dk.market.ledger import Tx

TAG_DRAW = "dk/v1/market/draw"
TAG_BEACON_SHARE = "dk/v1/market/beacon-share"
TAG_BEACON = "dk/v1/market/beacon"
DRAW_STREAM = "market-draw"
TREASURY = "treasury"  # withholding penalties; nobody can move money out of it
TERMINAL = ("released", "expired", "timed_out", "rejected", "slashed", "cancelled")


def vstake(account: str) -> str:
    """Holder name of a validator's locked stake."""
    return f"vstake:{account}"


def _oid(order_id: str) -> bytes:
    oid = order_id.encode("ascii")
    return u64(len(oid)) + oid


def draw_seed(
    market_id: bytes, prev_head: bytes, order_id: str, round_: int, entropy: bytes
) -> bytes:
    """The seed of draw round ``round_`` of an order (spec §5.3)."""
    return tagged_hash(TAG_DRAW, market_id, prev_head, _oid(order_id), u64(round_), entropy)


def draw(seed: bytes, eligible: list[str], count: int) -> list[str]:
    """``count`` accounts (fewer if the pool is smaller) drawn in order from ``eligible``."""
    pool = sorted(set(eligible))
    picks = sample_without_replacement(
        stream_key(DRAW_STREAM, 0, seed), len(pool), min(count, len(pool))
    )
    return [pool[i] for i in picks]


def share_message(
    market_id: bytes, order_id: str, transcript_root: bytes, manifest_digest: bytes
) -> bytes:
    """The 32-byte message a drawn validator signs for its beacon share (spec §5.1)."""
    return tagged_hash(
        TAG_BEACON_SHARE, market_id, _oid(order_id), transcript_root, manifest_digest
    )


def beacon_from(aggregate: bytes) -> bytes:
    """The beacon: ``H("dk/v1/market/beacon", aggregate of the shares)``."""
    return tagged_hash(TAG_BEACON, aggregate)


def order_share_message(market_id: bytes, order: Any) -> bytes:
    """:func:`share_message` for a submitted order row."""
    c = json.loads(order["commitment"])
    return share_message(
        market_id,
        order["order_id"],
        bytes.fromhex(c["transcript_root"]),
        bytes.fromhex(c["manifest_digest"]),
    )


def eligible(tx: Tx, config: MarketConfig, exclude: set[str]) -> list[str]:
    """Active validators holding at least the minimum stake, minus ``exclude``."""
    rows = tx.all("SELECT account FROM validators WHERE state = 'active'")
    return [
        r[0]
        for r in rows
        if r[0] not in exclude and tx.amount(vstake(r[0])) >= config.min_validator_stake
    ]


def draw_at_match(
    ctx: Context,
    tx: Tx,
    order: Any,
    worker: str,
    signature_hex: str,
    *,
    also: Iterable[str] = (),
) -> list[str]:
    """Draw an order's validator set inside the ``match`` transaction (``also``: the other
    workers of a cluster order, excluded like the worker).

    Raises:
        MarketRefused: ``NOT_ENOUGH_VALIDATORS`` if fewer than ``n`` are eligible.
    """
    n = json.loads(order["policy"])["n"]
    pool = eligible(tx, ctx.config, {order["consumer"], worker, *also})
    if len(pool) < n:
        raise MarketRefused(
            "NOT_ENOUGH_VALIDATORS", f"{len(pool)} eligible validators, the order needs {n}"
        )
    seed = draw_seed(ctx.market_id, tx.head, order["order_id"], 0, bytes.fromhex(signature_hex))
    chosen = draw(seed, pool, n)
    tx.exec(
        "UPDATE orders SET validators = ?, excluded = '[]', draw_round = 0 WHERE order_id = ?",
        (json.dumps(chosen), order["order_id"]),
    )
    return chosen


def members(order: Any) -> list[str]:
    """The order's current validator set (empty before the match)."""
    return json.loads(order["validators"]) if order["validators"] else []


def shares(tx: Tx, order_id: str) -> dict[str, str]:
    """Beacon shares posted for an order: ``{validator: signature hex}``."""
    return dict(
        (r[0], r[1])
        for r in tx.all(
            "SELECT validator, signature FROM beacon_shares WHERE order_id = ?", (order_id,)
        )
    )


def maybe_fix_beacon(ctx: Context, tx: Tx, order: Any, current: list[str]) -> None:
    """If every member of ``current`` has posted its share, fix and record the beacon."""
    posted = shares(tx, order["order_id"])
    if not current or any(v not in posted for v in current):
        return
    aggregate = ctx.bls.aggregate([bytes.fromhex(posted[v]) for v in current])
    beacon = beacon_from(aggregate)
    tx.exec("UPDATE orders SET beacon = ? WHERE order_id = ?", (beacon.hex(), order["order_id"]))
    tx.data.update({"aggregate": aggregate.hex(), "beacon": beacon.hex(), "set": current})


def redraw(ctx: Context, tx: Tx, order_id: str, now: int) -> None:
    """Replace the drawn validators that withheld their share past the share deadline.

    Each withholder loses ``min(withhold_penalty, its stake)`` to the treasury, leaves the
    order's set for good (it can never be drawn for this order again) and is replaced in place
    by a draw of round ``r + 1`` from the eligible validators outside the order; a slot with
    no replacement is dropped. The share deadline restarts at ``now``.

    Raises:
        MarketRefused: ``UNKNOWN_ORDER``, ``BAD_STATE``, ``NOT_YET`` (deadline not reached),
            ``NO_WITHHOLDER``.
    """
    order = tx.one("SELECT * FROM orders WHERE order_id = ?", (order_id,))
    if order is None:
        raise MarketRefused("UNKNOWN_ORDER", f"no order {order_id}")
    if order["state"] != "submitted" or order["beacon"]:
        raise MarketRefused("BAD_STATE", f"{order_id} is not waiting for beacon shares")
    if now < order["share_deadline"]:
        raise MarketRefused(
            "NOT_YET", f"shares of {order_id} are due until {order['share_deadline']}"
        )
    current, posted = members(order), shares(tx, order_id)
    withheld = [v for v in current if v not in posted]
    if not withheld:
        raise MarketRefused("NO_WITHHOLDER", f"every validator of {order_id} has shared")
    penalties = {}
    for v in withheld:
        amount = min(ctx.config.withhold_penalty, tx.amount(vstake(v)))
        if amount:
            tx.move(vstake(v), TREASURY, amount)
        penalties[v] = amount
    excluded = json.loads(order["excluded"]) + withheld
    round_ = order["draw_round"] + 1
    cluster = [r[0] for r in tx.all("SELECT worker FROM ranks WHERE order_id = ?", (order_id,))]
    outside = {order["consumer"], order["worker"], *cluster, *current, *excluded}
    seed = draw_seed(ctx.market_id, tx.head, order_id, round_, b"")
    fresh = iter(draw(seed, eligible(tx, ctx.config, outside), len(withheld)))
    kept = [v if v in posted else next(fresh, None) for v in current]
    new_set = [v for v in kept if v is not None]
    tx.exec(
        "UPDATE orders SET validators = ?, excluded = ?, draw_round = ?, share_deadline = ?"
        " WHERE order_id = ?",
        (
            json.dumps(new_set),
            json.dumps(excluded),
            round_,
            now + ctx.config.share_timeout,
            order_id,
        ),
    )
    tx.data = {
        "order_id": order_id,
        "round": round_,
        "withheld": withheld,
        "penalties": penalties,
        "validators": new_set,
    }
    maybe_fix_beacon(ctx, tx, order, new_set)


def return_stake(tx: Tx, account: str) -> int:
    """Move a validator's whole stake back to its account; returns the amount."""
    held = tx.amount(vstake(account))
    if held:
        tx.move(vstake(account), acct(account), held)
    return held
