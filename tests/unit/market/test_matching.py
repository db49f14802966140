"""Matching: best price among bids that satisfy every condition, price-time priority."""

from __future__ import annotations

import pytest
from market_support import T0, World

from dk.market import MarketRefused


def _order(world: World, **kw: object) -> str:
    params = {
        "job_id": "11" * 32,
        "max_price": 100,
        "min_stake": 10,
        "deadline": T0 + 100,
        "tags": {"region": "eu"},
        **kw,
    }
    return world.do("consumer", "order", **params)["order_id"]


def test_best_eligible_price_wins_and_show_explains(world: World) -> None:
    oid = _order(world)
    too_dear = world.do("worker", "bid", price=101, capacity=1, stake=10, tags={"region": "eu"})[
        "bid_id"
    ]
    wrong_region = world.do("worker", "bid", price=10, capacity=1, stake=10, tags={"region": "us"})[
        "bid_id"
    ]
    thin = world.do("worker", "bid", price=20, capacity=1, stake=5, tags={"region": "eu"})["bid_id"]
    first = world.do(
        "worker", "bid", price=50, capacity=1, stake=10, tags={"region": "eu", "gpu": "h100"}
    )["bid_id"]
    later = world.do("worker2", "bid", price=50, capacity=1, stake=20, tags={"region": "eu"})[
        "bid_id"
    ]
    own = world.do("consumer", "bid", price=1, capacity=1, stake=10, tags={"region": "eu"})[
        "bid_id"
    ]
    assert world.do("consumer", "match", order_id=oid)["bid_id"] == first
    shown = {b["bid_id"]: b for b in world.m.show(oid)["bids"]}
    assert shown[first]["status"] == "matched"
    assert shown[later]["status"] == "outbid"
    assert shown[too_dear]["reasons"] == ["PRICE_ABOVE_MAX (101 > 100)"]
    assert shown[wrong_region]["reasons"] == ["TAG_MISMATCH region (us != eu)"]
    assert shown[thin]["reasons"] == ["STAKE_BELOW_MIN (5 < 10)"]
    assert shown[own]["reasons"] == ["SELF_MATCH (worker is the consumer)"]
    # escrow now holds exactly the price; the change went back to the consumer
    assert world.m.show(oid)["escrow"] == 50 and world.m.show(oid)["locked_stake"] == 10
    assert world.m.audit().ok


def test_capacity_is_consumed(world: World) -> None:
    world.do("worker", "bid", price=50, capacity=1, stake=10, tags={"region": "eu"})
    world.do("consumer", "match", order_id=_order(world))
    oid = _order(world)
    with pytest.raises(MarketRefused) as e:
        world.do("consumer", "match", order_id=oid)
    assert e.value.reason == "NO_MATCH"
    assert "NO_CAPACITY" in world.m.show(oid)["bids"][0]["reasons"][0]


def test_match_after_deadline_is_refused(world: World) -> None:
    oid = _order(world)
    world.do("worker", "bid", price=50, capacity=1, stake=10, tags={"region": "eu"})
    with pytest.raises(MarketRefused) as e:
        world.do("consumer", "match", now=T0 + 100, order_id=oid)
    assert e.value.reason == "DEADLINE_PASSED"
