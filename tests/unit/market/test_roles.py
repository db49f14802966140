"""The Gensyn roles (SPEC V §11-§13): tolerance profiles, whistleblowers and the jackpot
treasury, and the escrow that locks the verification fee and refunds its excess."""

from __future__ import annotations

import json
from typing import Any

import pytest
from market_support import T0, VERIFY_CALLS, World, make_bundle, market_config, new_market

from dk.errors import FormatError
from dk.market import MarketRefused, bundle_commitment
from dk.market.beacon import TREASURY, members, vstake

PROFILED = {"profiles": 3}


def place(w: World, *, policy: dict[str, Any] | None = None, **extra: Any) -> str:
    return w.do(
        "consumer",
        "order",
        job_id=w.job.job_id.hex(),
        max_price=100,
        min_stake=50,
        deadline=T0 + 1000,
        policy=policy or {},
        **extra,
    )["order_id"]


def profile(w: World, who: str, oid: str, tolerance: float, distance: float = 1e-4) -> Any:
    return w.do(
        who,
        "profile",
        order_id=oid,
        job_id=w.job.job_id.hex(),
        distance=distance,
        tolerance=tolerance,
    )


def deliver(w: World, oid: str, *, bad: list[int] | None = None, worker: str = "worker") -> Any:
    bundle = make_bundle(
        w.tmp / f"bundle-{oid}", w.job.job_id, w.c[worker].account, bad_intervals=bad
    )
    w.do(worker, "submit", order_id=oid, **bundle_commitment(bundle))
    w.share(oid)
    assert w.at(T0 + 10).verify_result(oid, bundle, w.job)["ok"]
    w.attest(oid, drawn(w, oid)[:2])
    w.at(T0 + 20).accept(oid)
    return bundle


def drawn(w: World, oid: str) -> list[str]:
    """The names of the order's drawn validators, in set order."""
    by_account = {c.account: n for n, c in w.c.items()}
    return [by_account[v] for v in members(w.m.order(oid))]


def audit_ok(w: World) -> dict[str, int]:
    report = w.m.audit()
    assert report.ok, report.problems
    return report.totals


# -- profiles -------------------------------------------------------------------------------


def test_the_tolerance_is_the_median_and_an_outlier_loses_its_deposit(world: World) -> None:
    w = world
    w.register(["worker2"])
    oid = place(w, policy=PROFILED)
    profile(w, "v1", oid, 0.01)
    profile(w, "v2", oid, 0.012)
    profile(w, "v3", oid, 1.0)  # 100x the median: outside [median/4, median*4]
    profile(w, "worker2", oid, 0.001)  # 10x too tight (a consumer's friend): outside too
    names = ("v1", "v2", "v3", "worker2")
    before = {n: w.m.balance(w.c[n].account) for n in names}
    w.do("worker", "bid", price=80, capacity=1, stake=60)
    out = w.do("consumer", "match", order_id=oid)
    assert out["tolerance"] == 0.01 and len(out["forfeited"]) == 2  # lower median of 4
    assert json.loads(w.m.order(oid)["policy"])["tolerance"] == 0.01
    assert w.m.balance(w.c["v1"].account) == before["v1"] + 10  # deposits back
    assert w.m.balance(w.c["v2"].account) == before["v2"] + 10
    assert w.m.balance(w.c["v3"].account) == before["v3"]  # forfeited
    assert w.m.balance(w.c["worker2"].account) == before["worker2"]  # forfeited
    assert w.m.holding(TREASURY) == 20
    VERIFY_CALLS.clear()
    deliver(w, oid)
    assert VERIFY_CALLS[0]["tolerance"] == 0.01  # the market verifies at the profiled value
    totals = audit_ok(w)
    assert totals["treasury_in"] == 20 and totals["pdeposit"] == 0


def test_a_match_needs_enough_profiles_from_others_than_the_worker(world: World) -> None:
    w = world
    w.register(["challenger"])  # a validator that also works
    oid = place(w, policy=PROFILED)
    profile(w, "v1", oid, 0.01)
    profile(w, "v2", oid, 0.02)
    profile(w, "challenger", oid, 100.0)  # the worker's own, wild profile
    w.do("challenger", "bid", price=80, capacity=1, stake=60)
    with pytest.raises(MarketRefused) as e:
        w.do("consumer", "match", order_id=oid)
    assert e.value.reason == "NOT_ENOUGH_PROFILES"
    assert w.m.order(oid)["state"] == "open"  # nothing happened
    profile(w, "v3", oid, 0.03)
    out = w.do("consumer", "match", order_id=oid)
    assert out["tolerance"] == 0.02 and out["excluded"] and not out["forfeited"]
    audit_ok(w)


def test_profile_refusals(world: World) -> None:
    w = world
    plain, oid = place(w), place(w, policy=PROFILED)
    cases = [
        ("v1", plain, 0.1, 0.0, "NOT_PROFILED"),
        ("consumer", oid, 0.1, 0.0, "NOT_VALIDATOR"),
        ("worker", oid, 0.1, 0.0, "NOT_VALIDATOR"),
    ]
    for who, o, t, d, reason in cases:
        with pytest.raises(MarketRefused) as e:
            profile(w, who, o, t, d)
        assert e.value.reason == reason
    w.register(["consumer"])
    with pytest.raises(MarketRefused, match="SELF_PROFILE"):
        profile(w, "consumer", oid, 0.1)
    with pytest.raises(MarketRefused, match="JOB_MISMATCH"):
        w.do("v1", "profile", order_id=oid, job_id="00" * 32, distance=0.0, tolerance=0.1)
    for t, d in ((0.0, 0.0), (0.1, 0.2), (2e6, 0.0), (True, 0.0)):
        with pytest.raises(FormatError) as f:
            profile(w, "v1", oid, t, d)  # type: ignore[arg-type]
        assert f.value.reason == "BAD_PARAMS"
    profile(w, "v1", oid, 0.1)
    with pytest.raises(MarketRefused, match="ALREADY_PROFILED"):
        profile(w, "v1", oid, 0.2)
    with pytest.raises(FormatError):  # profiles must be 0 or >= min_profiles (3)
        place(w, policy={"profiles": 2})


def test_cancel_and_expiry_return_the_profile_deposits(world: World) -> None:
    w = world
    a, b = place(w, policy=PROFILED), place(w, policy=PROFILED)
    start = w.m.balance(w.c["v1"].account)
    profile(w, "v1", a, 0.1)
    profile(w, "v1", b, 0.1)
    assert w.m.balance(w.c["v1"].account) == start - 20
    w.do("consumer", "cancel_order", order_id=a)
    w.at(T0 + 1000).settle(b)
    assert w.m.balance(w.c["v1"].account) == start
    assert audit_ok(w)["pdeposit"] == 0


# -- whistles -------------------------------------------------------------------------------


def accepted_with_bad_interval(w: World, bad: list[int]) -> tuple[str, Any]:
    oid = place(w)
    w.do("worker", "bid", price=80, capacity=1, stake=60)
    w.do("consumer", "match", order_id=oid)
    return oid, deliver(w, oid, bad=bad)


def test_a_true_whistle_slashes_the_attesters_and_pays_the_whistleblower(world: World) -> None:
    w = world
    oid, bundle = accepted_with_bad_interval(w, [1])  # the attesters missed interval 1
    who = w.c["challenger"].account
    start = w.m.balance(who)
    wid = w.do("challenger", "whistle", now=T0 + 30, order_id=oid, interval=1, deposit=20)[
        "whistle_id"
    ]
    other = w.do("consumer", "whistle", now=T0 + 30, order_id=oid, interval=0, deposit=10)
    consumer_before = w.m.balance(w.c["consumer"].account)
    out = w.at(T0 + 40).resolve_whistle(wid, bundle, w.job)
    assert out["upheld"] and out["outcome"] == "slashed"
    assert out["voided"] == [other["whistle_id"]]  # its deposit returns
    # reward: the worker's stake (60) + both attesters' stakes (2 x 100) = 260 >= payout 200
    assert out["reward"] == 260 and out["top_up"] == 0
    assert w.m.balance(who) == start + 260
    assert w.m.balance(w.c["consumer"].account) == consumer_before + 80 + 10  # escrow back
    attesters, idle = drawn(w, oid)[:2], drawn(w, oid)[2]
    for v in attesters:
        assert w.m.holding(vstake(w.c[v].account)) == 0
    assert w.m.holding(vstake(w.c[idle].account)) == 100  # did not attest
    audit_ok(w)


def test_a_false_whistle_funds_the_treasury_which_tops_up_a_true_one(tmp_path: Any) -> None:
    m = new_market(tmp_path / "m.db", config=market_config(whistle_payout=1000))
    w = World(m, tmp_path)
    oid, bundle = accepted_with_bad_interval(w, [2])
    wid = w.do("challenger", "whistle", now=T0 + 30, order_id=oid, interval=0, deposit=50)[
        "whistle_id"
    ]  # interval 0 replays: a whistle on an attestation that was right
    out = w.at(T0 + 31).resolve_whistle(wid, bundle, w.job)
    assert not out["upheld"] and out["forfeited"] == 50
    assert w.m.holding(TREASURY) == 50
    assert all(w.m.holding(vstake(w.c[v].account)) == 100 for v in drawn(w, oid))
    start = w.m.balance(w.c["worker2"].account)
    wid2 = w.do("worker2", "whistle", now=T0 + 32, order_id=oid, interval=2, deposit=10)[
        "whistle_id"
    ]
    out = w.at(T0 + 33).resolve_whistle(wid2, bundle, w.job)
    assert out["upheld"] and out["top_up"] == 50  # 740 short; the treasury holds 50
    assert w.m.balance(w.c["worker2"].account) == start + 260 + 50
    assert w.m.holding(TREASURY) == 0
    totals = audit_ok(w)
    assert (totals["treasury_in"], totals["treasury_out"], totals["treasury"]) == (50, 50, 0)
    book = w.m.treasury()
    assert book["conserved"] and book["in"] == {"resolve_whistle": 50} and book["held"] == 0


def test_whistle_refusals(world: World) -> None:
    w = world
    oid, bundle = accepted_with_bad_interval(w, [1])

    def whistle(who: str, now: int = T0 + 30, **p: Any) -> Any:
        return w.do(who, "whistle", now=now, **{"order_id": oid, "interval": 1, "deposit": 10, **p})

    for who, params, reason in [
        ("worker", {}, "SELF_CHALLENGE"),
        (drawn(w, oid)[0], {}, "SELF_CHALLENGE"),  # an attester
        ("challenger", {"deposit": 9}, "DEPOSIT_TOO_SMALL"),
        ("challenger", {"interval": 3}, "NOT_CHALLENGED"),  # never in the attested challenge
    ]:
        with pytest.raises(MarketRefused) as e:
            whistle(who, **params)
        assert e.value.reason == reason, who
    with pytest.raises(MarketRefused, match="WINDOW_CLOSED"):
        whistle("challenger", now=T0 + 120)
    with pytest.raises(MarketRefused, match="BAD_STATE"):
        w.do("challenger", "whistle", order_id=place(w), interval=0, deposit=10)
    with pytest.raises(MarketRefused, match="UNKNOWN_WHISTLE"):
        w.m.resolve_whistle("w999", bundle, w.job)
    audit_ok(w)


def test_an_open_whistle_blocks_release_and_an_inconclusive_replay_moves_nothing(
    world: World,
) -> None:
    w = world
    oid, bundle = accepted_with_bad_interval(w, [])
    wid = w.do("challenger", "whistle", now=T0 + 30, order_id=oid, interval=0, deposit=10)[
        "whistle_id"
    ]
    with pytest.raises(MarketRefused, match="NOT_SETTLEABLE"):
        w.at(T0 + 500).settle(oid)
    unsure = make_bundle(
        w.tmp / "unsure", w.job.job_id, w.c["worker"].account, replay_inconclusive=True
    )
    w.m._replay = lambda *a, **k: __import__("market_support").fake_replay(unsure, None, 0)
    held = audit_ok(w)
    out = w.m.resolve_whistle(wid, bundle, w.job)
    assert out["verdict"] == "inconclusive" and "forfeited" not in out
    assert audit_ok(w)["wdeposit"] == held["wdeposit"] == 10
    w.m._replay = __import__("market_support").fake_replay
    assert not w.m.resolve_whistle(wid, bundle, w.job)["upheld"]
    assert w.at(T0 + 500).settle(oid)["outcome"] == "released"
    audit_ok(w)


def test_an_upheld_challenge_voids_open_whistles(world: World) -> None:
    w = world
    oid, bundle = accepted_with_bad_interval(w, [1, 3])
    start = w.m.balance(w.c["worker2"].account)
    wid = w.do("worker2", "whistle", now=T0 + 30, order_id=oid, interval=0, deposit=10)[
        "whistle_id"
    ]
    cid = w.do("challenger", "challenge", now=T0 + 30, order_id=oid, bond=5, interval=3)[
        "challenge_id"
    ]
    out = w.at(T0 + 31).resolve_challenge(cid, bundle, w.job)
    assert out["upheld"] and out["voided_whistles"] == [wid]
    assert w.m.balance(w.c["worker2"].account) == start
    audit_ok(w)


# -- escrow: the verification fee ------------------------------------------------------------


def test_escrow_locks_the_fee_and_refunds_its_excess_at_release(world: World) -> None:
    w = world
    consumer = w.c["consumer"].account
    start = w.m.balance(consumer)
    oid = place(w, fee=30, fee_intervals=6)
    assert w.m.balance(consumer) == start - 130  # price bound + the fee estimate
    w.do("worker", "bid", price=80, capacity=1, stake=60)
    w.do("consumer", "match", order_id=oid)
    assert w.m.show(oid)["escrow"] == 110  # price + fee
    deliver(w, oid)
    a1, a2 = (w.c[n].account for n in drawn(w, oid)[:2])
    before = w.m.balance(a1)
    out = w.at(T0 + 200).settle(oid)
    # 3 of the 6 estimated intervals were challenged: 15 due, 7 to each of 2 attesters
    assert out["fee_paid"] == {a1: 7, a2: 7}
    assert out["refund"] == 16 and out["price"] == 80
    assert w.m.balance(a1) == before + 7
    assert w.m.balance(consumer) == start - 80 - 14
    explained = w.m.explain(oid)
    assert explained["escrow"]["fee_due"] == 15 and explained["escrow"]["challenged"] == 3
    audit_ok(w)


def test_every_other_outcome_refunds_the_whole_fee(world: World) -> None:
    w = world
    consumer = w.c["consumer"].account
    start = w.m.balance(consumer)
    a = place(w, fee=30, fee_intervals=6)
    w.do("consumer", "cancel_order", order_id=a)
    b = place(w, fee=30, fee_intervals=6)
    w.do("worker", "bid", price=80, capacity=1, stake=60)
    w.do("consumer", "match", order_id=b)
    w.at(T0 + 1000).settle(b)  # timed out: nothing submitted
    assert w.m.balance(consumer) == start + 60  # and the worker's stake
    with pytest.raises(FormatError, match="both fee and fee_intervals"):
        place(w, fee=30)
    audit_ok(w)


def test_a_profile_stops_counting_when_its_author_retires(world: World) -> None:
    """Register, profile, retire (stake back): the profile no longer counts (a Sybil would
    otherwise move the median for a deposit alone)."""
    w = world
    w.register(["worker2"])
    oid = place(w, policy=PROFILED)
    for name, t in (("v1", 0.01), ("v2", 0.02), ("worker2", 0.03)):
        profile(w, name, oid, t)
    w.do("worker2", "unregister_validator")
    w.do("worker", "bid", price=80, capacity=1, stake=60)
    with pytest.raises(MarketRefused, match="NOT_ENOUGH_PROFILES"):
        w.do("consumer", "match", order_id=oid)
    profile(w, "v3", oid, 1.0)
    out = w.do("consumer", "match", order_id=oid)
    assert out["tolerance"] == 0.02 and len(out["excluded"]) == 1
    assert w.m.holding("pdeposit:" + out["excluded"][0]) == 0  # returned
    audit_ok(w)
