"""Validator stake, the market's draw, beacon shares, redraws, and what the audit re-checks."""

from __future__ import annotations

import json

import pytest
from market_support import T0, World

from dk.crypto.canonical_json import canonical_json
from dk.market import MarketRefused
from dk.market.beacon import beacon_from, draw, draw_seed
from dk.market.ledger import event_hash


def _rewrite(world: World, pick, edit) -> None:
    """Edit the data of the first event ``pick(body)`` selects and re-hash the chain after it
    (a forger with write access to the file; request signatures are untouched)."""
    con = world.m.ledger.con
    rows = con.execute("SELECT seq, prev_hash, body FROM events ORDER BY seq").fetchall()
    prev, done = None, False
    for seq, prev_hash, raw in rows:
        body = json.loads(raw)
        if pick(body) and not done:
            edit(body["data"])
            done = True
        link = prev if prev is not None else bytes(prev_hash)
        digest = event_hash(link, body)
        con.execute(
            "UPDATE events SET prev_hash = ?, hash = ?, body = ? WHERE seq = ?",
            (link, digest, canonical_json(body), seq),
        )
        prev = digest


def test_registration_locks_the_stake(world: World) -> None:
    v1 = world.c["v1"].account
    assert world.m.holding(f"vstake:{v1}") == 100 and world.m.balance(v1) == 900
    with pytest.raises(MarketRefused) as e:
        world.register(["v1"])
    assert e.value.reason == "ALREADY_REGISTERED"
    report = world.m.audit()
    assert report.ok and report.totals["vstake"] == 300


def test_match_needs_n_eligible_validators(world: World) -> None:
    oid = world.do(
        "consumer",
        "order",
        job_id=world.job.job_id.hex(),
        max_price=100,
        min_stake=0,
        deadline=T0 + 1000,
        policy={"k": 2, "n": 4},
    )["order_id"]
    world.do("worker", "bid", price=80, capacity=1, stake=0)
    with pytest.raises(MarketRefused) as e:
        world.do("consumer", "match", order_id=oid)
    assert e.value.reason == "NOT_ENOUGH_VALIDATORS"
    world.register(["worker2"])
    drawn = world.do("consumer", "match", order_id=oid)["validators"]
    assert len(drawn) == 4 and len(set(drawn)) == 4


def test_draw_is_the_specified_function_of_head_and_consumer_signature(world: World) -> None:
    oid = world.do(
        "consumer",
        "order",
        job_id=world.job.job_id.hex(),
        max_price=100,
        min_stake=0,
        deadline=T0 + 1000,
        policy={"k": 1, "n": 2},
    )["order_id"]
    world.do("worker", "bid", price=80, capacity=1, stake=0)
    head = world.m.ledger.head()[1]
    env = world.c["consumer"].request("match", order_id=oid)
    drawn = world.at(T0).execute(env)["validators"]
    seed = draw_seed(world.m.market_id, head, oid, 0, bytes.fromhex(env["signature"]))
    assert drawn == draw(seed, [world.c[n].account for n in ("v1", "v2", "v3")], 2)


def test_shares_fix_the_beacon(world: World) -> None:
    oid, _ = world.to_submitted()
    with pytest.raises(MarketRefused) as e:
        world.do(
            "v1",
            "beacon_share",
            order_id=oid,
            signature=world.bls.sign(world.sk["v1"], b"another message").hex(),
        )
    assert e.value.reason == "BAD_SHARE"
    world.share(oid, ["v1"])
    with pytest.raises(MarketRefused) as e:
        world.share(oid, ["v1"])
    assert e.value.reason == "ALREADY_SHARED"
    assert world.m.order(oid)["beacon"] is None
    out = world.share(oid, ["v2", "v3"])
    assert out["beacon"] == beacon_from(bytes.fromhex(out["aggregate"])).hex()
    assert world.m.order(oid)["beacon"] == out["beacon"]
    assert world.m.audit().ok


def test_audit_catches_a_rewritten_draw(world: World) -> None:
    world.register(["worker2"])  # four validators, three drawn: a swap is possible
    oid, _ = world.to_submitted()
    drawn = world.m.show(oid)["validators"]
    spare = next(
        world.c[n].account for n in ("v1", "v2", "v3", "worker2") if world.c[n].account not in drawn
    )
    _rewrite(world, lambda b: b["kind"] == "match", lambda d: d["validators"].__setitem__(0, spare))
    assert any(p.split(": ")[1] == "DRAW_MISMATCH" for p in world.m.audit().problems)


def test_audit_catches_a_rewritten_beacon(world: World) -> None:
    oid, bundle = world.to_submitted()
    world.share(oid)
    world.at(T0 + 10).verify_result(oid, bundle, world.job)

    _rewrite(world, lambda b: "beacon" in b["data"], lambda d: d.update(beacon="11" * 32))
    problems = world.m.audit().problems
    assert any("BEACON_MISMATCH" in p for p in problems), problems


def test_redraw_with_an_empty_pool_shrinks_the_set(world: World) -> None:
    oid, _ = world.to_submitted()
    world.share(oid, ["v1", "v2"])
    t = world.m.order(oid)["share_deadline"]
    out = world.at(t).redraw(oid)
    assert out["validators"] == [v for v in world.m.show(oid)["validators"]]
    assert world.c["v3"].account not in out["validators"] and out["beacon"]  # fixed by v1, v2
    with pytest.raises(MarketRefused) as e:
        world.at(t + 1000).redraw(oid)
    assert e.value.reason == "BAD_STATE"
    assert world.m.audit().ok


def test_a_validator_slashed_since_it_attested_does_not_count(world: World) -> None:
    """SPEC V §5.2-§5.3: v1 and v2 attest X, are slashed on Y, and X is then accepted on their
    attestations: nothing backs that acceptance (their stakes are gone). The market refuses;
    a ledger where it happened anyway fails the audit."""
    w = world
    x, bx = w.to_submitted()
    w.share(x)
    assert w.at(T0 + 10).verify_result(x, bx, w.job)["ok"]
    w.attest(x, ["v1", "v2"], now=T0 + 10)
    y, by = w.to_accepted(bad=[2])
    cid = w.do("challenger", "challenge", now=T0 + 21, order_id=y, bond=5, interval=2)
    assert w.at(T0 + 22).resolve_challenge(cid["challenge_id"], by, w.job)["upheld"]
    with pytest.raises(MarketRefused) as e:
        w.at(T0 + 30).accept(x)
    assert e.value.reason == "NOT_ENOUGH_ATTESTATIONS"
    assert w.m.audit(check_bls=False).ok
    con = w.m.ledger.con  # the market before this rule: the slashed still counted
    con.execute("UPDATE validators SET state = 'active' WHERE state = 'slashed'")
    w.at(T0 + 30).accept(x)
    problems = w.m.audit(check_bls=False).problems
    assert any("NOT_VALIDATOR" in p and x in p for p in problems), problems


def test_a_challenge_names_an_interval_the_result_has(world: World) -> None:
    """A bond on interval 99 of a 4-interval result was posted and then lost as a failed
    challenge; the intervals the verification recorded bound it (BAD_PARAMS)."""
    from dk.errors import FormatError

    w = world
    oid, _ = w.to_accepted()
    assert json.loads(w.m.order(oid)["policy"])["intervals"] == 4
    with pytest.raises(FormatError) as e:
        w.do("challenger", "challenge", now=T0 + 21, order_id=oid, bond=5, interval=4)
    assert e.value.reason == "BAD_PARAMS"
    assert w.do("challenger", "challenge", now=T0 + 21, order_id=oid, bond=5, interval=3)
