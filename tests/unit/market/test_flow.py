"""A job through the market with test doubles: release, rejection, timeout, challenges."""

from __future__ import annotations

import pytest
from market_support import T0, World

from dk.market import MarketRefused


def test_honest_job_pays_worker_after_window(world: World) -> None:
    oid, _ = world.to_accepted()
    w, c = world.c["worker"].account, world.c["consumer"].account
    with pytest.raises(MarketRefused) as e:
        world.at(T0 + 119).settle(oid)
    assert e.value.reason == "NOT_SETTLEABLE"
    assert world.at(T0 + 120).settle(oid)["outcome"] == "released"
    assert world.m.balance(w) == 1000 - 60 + 60 + 80
    assert world.m.balance(c) == 1000 - 80
    with pytest.raises(MarketRefused) as e:
        world.at(T0 + 500).settle(oid)
    assert e.value.reason == "ALREADY_SETTLED"
    assert world.m.audit().ok


def test_forged_bundle_is_rejected_refunded_and_slashed(world: World) -> None:
    oid, _ = world.to_accepted(forged=True)
    order = world.m.order(oid)
    assert order["state"] == "rejected"
    assert world.m.balance(world.c["worker"].account) == 1000 - 60
    assert world.m.balance(world.c["consumer"].account) == 1000 + 60
    with pytest.raises(MarketRefused) as e:
        world.at(T0 + 5000).settle(oid)
    assert e.value.reason == "ALREADY_SETTLED"
    assert world.m.audit().ok


def test_accept_needs_k_valid_attestations(world: World) -> None:
    oid, bundle = world.to_submitted()
    with pytest.raises(MarketRefused) as e:  # no beacon before every drawn validator shared
        world.at(T0).verify_result(oid, bundle, world.job)
    assert e.value.reason == "NO_BEACON"
    world.share(oid)
    digest = world.at(T0).verify_result(oid, bundle, world.job)["report_digest"]
    world.do(
        "v1",
        "attest",
        order_id=oid,
        report_digest=digest,
        signature=world.bls.sign(world.sk["v1"], b"wrong message").hex(),
    )
    with pytest.raises(MarketRefused) as e:
        world.at(T0).accept(oid)
    assert e.value.reason == "NOT_ENOUGH_ATTESTATIONS"
    with pytest.raises(MarketRefused) as e:
        world.do("challenger", "attest", order_id=oid, report_digest=digest, signature="00" * 96)
    assert e.value.reason == "NOT_VALIDATOR"
    with pytest.raises(MarketRefused) as e:
        world.do("v2", "attest", order_id=oid, report_digest="ab" * 32, signature="00" * 96)
    assert e.value.reason == "DIGEST_MISMATCH"
    world.attest(oid, ["v2", "v3"])
    assert sorted(world.at(T0).accept(oid)["signers"]) == sorted(
        [world.c["v2"].account, world.c["v3"].account]
    )


def test_timeout_without_submission_refunds_and_slashes(world: World) -> None:
    oid = world.do(
        "consumer",
        "order",
        job_id=world.job.job_id.hex(),
        max_price=100,
        min_stake=10,
        deadline=T0 + 50,
    )["order_id"]
    world.do("worker", "bid", price=70, capacity=1, stake=10)
    world.do("consumer", "match", order_id=oid)
    with pytest.raises(MarketRefused):
        world.at(T0 + 49).settle(oid)
    assert world.at(T0 + 50).settle(oid)["outcome"] == "timed_out"
    assert world.m.balance(world.c["consumer"].account) == 1010
    with pytest.raises(MarketRefused) as e:
        world.do(
            "worker",
            "submit",
            now=T0 + 60,
            order_id=oid,
            transcript_root="00" * 32,
            manifest_digest="00" * 32,
        )
    assert e.value.reason == "BAD_STATE"
    assert world.m.audit().ok


def test_expired_open_order_is_refunded(world: World) -> None:
    oid = world.do(
        "consumer",
        "order",
        job_id=world.job.job_id.hex(),
        max_price=100,
        min_stake=0,
        deadline=T0 + 5,
    )["order_id"]
    assert world.at(T0 + 5).settle(oid)["outcome"] == "expired"
    assert world.m.balance(world.c["consumer"].account) == 1000


def test_upheld_challenge_pays_challenger_from_stake(world: World) -> None:
    oid, bundle = world.to_accepted(bad=[2])
    cid = world.do("challenger", "challenge", now=T0 + 30, order_id=oid, bond=5, interval=2)[
        "challenge_id"
    ]
    with pytest.raises(MarketRefused) as e:
        world.at(T0 + 500).settle(oid)
    assert e.value.reason == "NOT_SETTLEABLE"
    out = world.at(T0 + 40).resolve_challenge(cid, bundle, world.job)
    assert out["upheld"] and out["interval"] == 2
    # the worker's stake and the whole stake of both validators who attested the wrong result
    assert world.m.balance(world.c["challenger"].account) == 1000 + 60 + 2 * 100
    for v in ("v1", "v2"):
        assert world.m.holding(f"vstake:{world.c[v].account}") == 0
    assert world.m.holding(f"vstake:{world.c['v3'].account}") == 100  # v3 did not attest
    states = dict(world.m.ledger.con.execute("SELECT account, state FROM validators"))
    assert states[world.c["v1"].account] == "slashed" and states[world.c["v3"].account] == "active"
    assert world.m.balance(world.c["consumer"].account) == 1000
    assert world.m.balance(world.c["worker"].account) == 1000 - 60
    assert world.m.order(oid)["state"] == "slashed"
    assert world.m.audit().ok


def test_failed_challenge_loses_bond_to_worker(world: World) -> None:
    oid, bundle = world.to_accepted(bad=[2])
    cid = world.do("challenger", "challenge", now=T0 + 30, order_id=oid, bond=5, interval=1)[
        "challenge_id"
    ]
    assert not world.at(T0 + 40).resolve_challenge(cid, bundle, world.job)["upheld"]
    assert world.at(T0 + 120).settle(oid)["outcome"] == "released"
    assert world.m.balance(world.c["challenger"].account) == 995
    assert world.m.balance(world.c["worker"].account) == 1000 + 80 + 5
    assert world.m.audit().ok


def test_counter_transcript_bisects_to_first_difference(world: World) -> None:
    oid, bundle = world.to_accepted(bad=[1])
    import json

    ours = [c["root"] for c in json.loads((bundle / "manifest.json").read_text())["checkpoints"]]
    theirs = ours[:2] + ["ee" * 32] * 3
    cid = world.do(
        "challenger", "challenge", now=T0 + 30, order_id=oid, bond=5, counter_roots=theirs
    )["challenge_id"]
    out = world.at(T0 + 40).resolve_challenge(cid, bundle, world.job)
    assert out["interval"] == 1 and out["upheld"]


def test_challenge_window_and_self_challenge(world: World) -> None:
    oid, _ = world.to_accepted()
    with pytest.raises(MarketRefused) as e:
        world.do("challenger", "challenge", now=T0 + 120, order_id=oid, bond=5, interval=0)
    assert e.value.reason == "WINDOW_CLOSED"
    with pytest.raises(MarketRefused) as e:
        world.do("worker", "challenge", now=T0 + 30, order_id=oid, bond=5, interval=0)
    assert e.value.reason == "SELF_CHALLENGE"


def test_a_local_ledger_verifies_only_a_bundle_it_is_given(world: World) -> None:
    """No bundle: a market server verifies the copy it holds; a ledger here holds none, so the
    library says so (a usage error, exit 2) instead of failing inside the bundle check."""
    from dk.errors import UsageError

    oid, bundle = world.to_submitted()
    world.share(oid)
    with pytest.raises(UsageError, match="name the BUNDLE"):
        world.m.verify_result(oid, None, world.job)
    params = world.m.deliver(oid, world.c["worker"].account, bundle)  # what the CLI submits
    assert params["order_id"] == oid and set(params) == {
        "order_id",
        "transcript_root",
        "manifest_digest",
    }
