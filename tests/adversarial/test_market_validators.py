"""Attack: the worker impersonates validators (issue 10, item 5).

Before the fix a validator registration was a signature with no stake and any registered
account's attestation counted: a worker registered k fresh accounts and attested its own
result. Now a validator locks a stake, each order's validators are drawn by the market at match
time, and only drawn validators can share or attest; a wrong attestation costs the stake.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.unit.market.market_support import T0, World, key, new_market

from dk.crypto.keys import SigningKey
from dk.errors import FormatError
from dk.market import Client, MarketRefused


def _world(tmp: Path) -> World:
    return World(new_market(tmp / "m.db"), tmp)


def _sybils(world: World, count: int) -> list[str]:
    """``count`` fresh accounts the worker controls, funded and (where allowed) registered."""
    names = []
    for i in range(count):
        name = f"sybil{i}"
        world.c[name] = Client(key(50 + i), world.m.market_id)
        world.sk[name] = 5000 + i
        world.do("worker", "transfer", to=world.c[name].account, amount=150)
        names.append(name)
    return names


def test_worker_fresh_accounts_cannot_settle_its_order(tmp_path: Path) -> None:
    world = _world(tmp_path)
    oid, bundle = world.to_submitted()
    sybils = _sybils(world, 2)
    for n in sybils:  # a registration with no stake (or too little) is refused
        with pytest.raises(FormatError):
            world.do(
                n,
                "register_validator",
                bls_pk=world.bls.sk_to_pk(world.sk[n]).hex(),
                pop=world.bls.pop_prove(world.sk[n]).hex(),
            )
        with pytest.raises(MarketRefused) as e:
            world.register([n], stake=99)
        assert e.value.reason == "STAKE_TOO_SMALL"
    world.register(sybils)  # staked now, but the draw happened at match time
    for n in sybils:
        with pytest.raises(MarketRefused) as e:
            world.do(
                n, "beacon_share", order_id=oid, signature=world.bls.sign(world.sk[n], b"x").hex()
            )
        assert e.value.reason == "NOT_DRAWN"
    world.share(oid)  # the drawn validators fix the beacon
    world.at(T0 + 10).verify_result(oid, bundle, world.job)
    with pytest.raises(MarketRefused) as e:
        world.attest(oid, sybils)
    assert e.value.reason == "NOT_DRAWN"
    with pytest.raises(MarketRefused) as e:
        world.at(T0 + 20).accept(oid)
    assert e.value.reason == "NOT_ENOUGH_ATTESTATIONS"
    # after the deadline the order times out: the consumer is refunded, the worker never paid
    assert world.at(T0 + 5000).settle(oid)["outcome"] == "timed_out"
    assert world.m.balance(world.c["consumer"].account) == 1000
    assert world.m.audit().ok


def test_worker_and_consumer_are_never_drawn(tmp_path: Path) -> None:
    world = _world(tmp_path)
    world.register(["worker", "consumer"])  # both stake as validators too
    oid = world.to_submitted()[0]
    drawn = world.m.show(oid)["validators"]
    assert world.c["worker"].account not in drawn and world.c["consumer"].account not in drawn
    assert sorted(drawn) == sorted(world.c[n].account for n in ("v1", "v2", "v3"))


def test_wrong_attestation_costs_the_validators_their_stake(tmp_path: Path) -> None:
    world = _world(tmp_path)
    oid, bundle = world.to_accepted(bad=[2])  # the attested result skipped interval 2
    cid = world.do("challenger", "challenge", now=T0 + 30, order_id=oid, bond=5, interval=2)[
        "challenge_id"
    ]
    out = world.at(T0 + 40).resolve_challenge(cid, bundle, world.job)
    assert out["upheld"] and set(out["slashed_validators"]) == {
        world.c["v1"].account,
        world.c["v2"].account,
    }
    for n in ("v1", "v2"):
        assert world.m.holding(f"vstake:{world.c[n].account}") == 0
        with pytest.raises(MarketRefused) as e:  # a slashed validator is no longer one
            world.do(n, "unregister_validator")
        assert e.value.reason == "NOT_VALIDATOR"
    assert world.m.audit().ok


def test_drawn_validator_cannot_withdraw_its_stake_before_settlement(tmp_path: Path) -> None:
    world = _world(tmp_path)
    oid, _ = world.to_accepted()
    with pytest.raises(MarketRefused) as e:
        world.do("v1", "unregister_validator")
    assert e.value.reason == "VALIDATOR_BUSY"
    world.at(T0 + 120).settle(oid)
    assert world.do("v1", "unregister_validator", now=T0 + 121)["returned"] == 100
    assert world.m.audit().ok


def test_withholding_a_share_buys_one_reroll_at_a_price(tmp_path: Path) -> None:
    """A drawn validator that saw the other shares and dislikes the beacon withholds: after the
    share timeout it is penalised, leaves the order for good, and is replaced by a new draw."""
    world = _world(tmp_path)
    extra = Client(SigningKey(bytes([77]) * 32), world.m.market_id)
    world.c["v4"], world.sk["v4"] = extra, 4444
    world.do("v4", "deposit", amount=1000)
    world.register(["v4"])
    oid, _ = world.to_submitted()
    drawn = world.m.show(oid)["validators"]
    by_account = {c.account: n for n, c in world.c.items()}
    withholder = by_account[drawn[-1]]
    world.share(oid, [by_account[v] for v in drawn[:-1]])
    deadline = world.m.order(oid)["share_deadline"]
    with pytest.raises(MarketRefused) as e:
        world.at(deadline - 1).redraw(oid)
    assert e.value.reason == "NOT_YET"
    out = world.at(deadline).redraw(oid)
    assert out["withheld"] == [drawn[-1]] and out["penalties"] == {drawn[-1]: 10}
    assert world.m.holding("treasury") == 10
    assert world.m.holding(f"vstake:{drawn[-1]}") == 90
    new = world.m.show(oid)["validators"]
    assert drawn[-1] not in new and len(new) == 3
    with pytest.raises(MarketRefused) as e:  # the withholder is out of this order for good
        world.do(withholder, "beacon_share", now=deadline, order_id=oid, signature="00" * 96)
    assert e.value.reason == "NOT_DRAWN"
    world.share(oid, [by_account[new[-1]]], now=deadline + 1)
    assert world.m.order(oid)["beacon"]
    assert world.m.audit().ok
