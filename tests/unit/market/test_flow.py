"""A job through the market with test doubles: release, rejection, timeout, challenges."""

from __future__ import annotations

import pytest

from dk.market import MarketRefused

from market_support import T0, World


def test_honest_job_pays_worker_after_window(world: World) -> None:
    oid, _ = world.to_accepted()
    w, c = world.c["worker"].account, world.c["consumer"].account
    with pytest.raises(MarketRefused) as e:
        world.m.settle(oid, now=T0 + 119)
    assert e.value.reason == "NOT_SETTLEABLE"
    assert world.m.settle(oid, now=T0 + 120)["outcome"] == "released"
    assert world.m.balance(w) == 1000 - 60 + 60 + 80
    assert world.m.balance(c) == 1000 - 80
    with pytest.raises(MarketRefused) as e:
        world.m.settle(oid, now=T0 + 500)
    assert e.value.reason == "ALREADY_SETTLED"
    assert world.m.audit().ok
