"""Cluster orders (SPEC Part V §14): rank slots, split payment, per-rank slashing."""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from market_support import T0, World, fake_replay, fake_verify, key, market_config, new_market

from dk.crypto.keys import SigningKey
from dk.errors import FormatError
from dk.market import Client, Market, MarketRefused, bundle_commitment
from dk.market.cluster import rank_shares, rank_signature, sample_counts
from dk.market.cluster_flow import rank_stake


@dataclass
class ClusterJob:
    job_id: bytes
    train: dict[str, Any] = field(default_factory=dict)


@dataclass
class Replay:
    verdict: str
    blame: Any


def cluster_verify(bundle_dir: Path, job: Any, **kw: Any) -> Any:
    """fake_verify, plus the ``blame`` the manifest asks for (the dp verifier's field)."""
    report = fake_verify(bundle_dir, job, **kw)
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    report.blame = manifest.get("blame", [])  # type: ignore[attr-defined]
    return report


def cluster_replay(bundle_dir: Path, job: Any, index: int) -> Any:
    ok = fake_replay(bundle_dir, job, index)
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    return Replay("accept" if ok else "reject", manifest.get("replay_blame", []))


def cluster_bundle(
    path: Path,
    job_id: bytes,
    keys: list[SigningKey],
    *,
    signers: list[SigningKey] | None = None,
    **flags: Any,
) -> Path:
    """A W-rank bundle to the dp contract: ``ranks`` and ``rank_signatures`` in the manifest."""
    path.mkdir(parents=True, exist_ok=True)
    roots = [hashlib.sha256(bytes([i])).hexdigest() for i in range(5)]
    root = hashlib.sha256("".join(roots).encode()).hexdigest()
    signers = signers or keys
    manifest = {
        "job_id": job_id.hex(),
        "worker_key": keys[0].verify_key.hex(),
        "transcript_root": root,
        "checkpoints": [{"root": r} for r in roots],
        "ext": {
            "ranks": [{"rank": r, "worker_key": k.verify_key.hex()} for r, k in enumerate(keys)]
        },
        "rank_signatures": [
            rank_signature(s, job_id, bytes.fromhex(root), r) for r, s in enumerate(signers)
        ],
        "bad_intervals": [],
        **flags,
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


class Cluster:
    """A World with a third worker and a cluster job."""

    def __init__(self, m: Market, tmp: Path, *, world_size: int = 2, batch_size: int = 33):
        self.w = World(m, tmp)
        self.w.c["worker3"] = Client(key(30), m.market_id)
        self.w.do("worker3", "deposit", amount=1000)
        self.keys = {"worker": key(2), "worker2": key(3), "worker3": key(30)}
        self.job = ClusterJob(
            hashlib.sha256(b"cluster job").digest(),
            {"world_size": world_size, "batch_size": batch_size},
        )
        self.size = world_size

    def acct(self, name: str) -> str:
        return self.w.c[name].account

    def bal(self, name: str) -> int:
        return self.w.m.balance(self.acct(name))

    def order(self, max_price: int = 200, **kw: Any) -> str:
        return str(
            self.w.do(
                "consumer",
                "order",
                job_id=self.job.job_id.hex(),
                max_price=max_price,
                min_stake=20,
                deadline=T0 + 1000,
                world_size=self.size,
                **kw,
            )["order_id"]
        )

    def matched(self) -> tuple[str, dict[str, Any]]:
        oid = self.order()
        self.w.do("worker", "bid", price=70, capacity=1, stake=30)
        self.w.do("worker2", "bid", price=80, capacity=1, stake=40)
        return oid, self.w.do("consumer", "match", order_id=oid)

    def submitted(self, **flags: Any) -> tuple[str, Path]:
        oid, _ = self.matched()
        names = ["worker", "worker2", "worker3"][: self.size]
        bundle = cluster_bundle(
            self.w.tmp / f"bundle-{oid}", self.job.job_id, [self.keys[n] for n in names], **flags
        )
        self.w.do("worker", "submit", order_id=oid, **bundle_commitment(bundle))
        self.w.share(oid)
        return oid, bundle

    def accepted(self, **flags: Any) -> tuple[str, Path]:
        oid, bundle = self.submitted(**flags)
        out = self.w.at(T0 + 10).verify_result(oid, bundle, self.job)
        assert out["verdict"] == "accept", out
        self.w.attest(oid, ["v1", "v2"])
        self.w.at(T0 + 20).accept(oid)
        return oid, bundle


@pytest.fixture
def cl(tmp_path: Path) -> Iterator[Cluster]:
    m = new_market(tmp_path / "m.db", verify=cluster_verify, replay=cluster_replay)
    yield Cluster(m, tmp_path)
    m.close()


def test_shares_follow_the_batch_split_and_sum_exactly() -> None:
    assert sample_counts(2, 33) == [17, 16]
    assert sample_counts(3, 32) == [11, 11, 10]
    assert rank_shares(160, 2, 33) == [83, 77]  # 82.4 and 77.6 floored; remainder to rank 0
    assert rank_shares(160, 2, 32) == [80, 80]
    assert rank_shares(100, 3, 32) == [35, 34, 31]
    assert rank_shares(5, 4, 2) == [3, 2, 0, 0]  # ranks beyond the batch process nothing
    for price in (1, 7, 160, 10**12 + 3):
        for w in (1, 2, 3, 7, 64):
            for b in (1, 5, 32, 33, 1000):
                shares = rank_shares(price, w, b)
                assert sum(shares) == price and min(shares) >= 0
                assert shares[1:] == [price * n // b for n in sample_counts(w, b)[1:]]


def test_match_fills_rank_slots_by_price_time_with_distinct_workers(cl: Cluster) -> None:
    w = cl.w
    oid = cl.order()
    w.do("worker", "bid", price=70, capacity=2, stake=30)
    w.do("worker", "bid", price=60, capacity=1, stake=30)  # the same worker's cheaper bid
    w.do("worker3", "bid", price=101, capacity=1, stake=50)  # above max_price // W = 100
    w.do("worker2", "bid", price=80, capacity=1, stake=40)
    out = w.do("consumer", "match", order_id=oid)
    assert [r["worker"] for r in out["ranks"]] == [cl.acct("worker"), cl.acct("worker2")]
    assert out["ranks"][0]["price"] == 60 and out["slot_price"] == 80
    assert out["price"] == 160 and out["worker"] == cl.acct("worker")
    assert not {cl.acct("worker"), cl.acct("worker2")} & set(out["validators"])
    assert w.m.holding(f"escrow:{oid}") == 160
    assert cl.bal("consumer") == 1000 - 160
    assert w.m.holding(rank_stake(oid, 0)) == 30 and w.m.holding(rank_stake(oid, 1)) == 40
    shown = w.m.show(oid)
    assert shown["world_size"] == 2
    assert [r["locked_stake"] for r in shown["ranks"]] == [30, 40]
    status = {b["bid_id"]: b["status"] for b in shown["bids"]}
    assert sorted(s for s in status.values() if s == "matched") == ["matched", "matched"]
    assert w.m.audit(check_bls=False).ok


def test_a_cluster_needs_w_distinct_workers(cl: Cluster) -> None:
    w = cl.w
    oid = cl.order()
    w.do("worker", "bid", price=70, capacity=5, stake=30)
    w.do("worker", "bid", price=71, capacity=5, stake=30)
    with pytest.raises(MarketRefused) as e:
        w.do("consumer", "match", order_id=oid)
    assert e.value.reason == "NO_MATCH"
    w.do("consumer", "bid", price=50, capacity=1, stake=30)  # the consumer never takes a slot
    with pytest.raises(MarketRefused) as e:
        w.do("consumer", "match", order_id=oid)
    assert e.value.reason == "NO_MATCH"


@pytest.mark.parametrize("bad", [0, 65, True, "2", 1.5])
def test_world_size_must_be_1_to_64(cl: Cluster, bad: Any) -> None:
    with pytest.raises(FormatError) as e:
        cl.w.do(
            "consumer",
            "order",
            job_id="ab" * 32,
            max_price=10,
            min_stake=0,
            deadline=T0 + 10,
            world_size=bad,
        )
    assert e.value.reason == "BAD_PARAMS"


def test_world_size_1_is_the_ordinary_flow(cl: Cluster) -> None:
    w = cl.w
    oid = w.do(
        "consumer", "order", job_id="ab" * 32, max_price=100, min_stake=0, deadline=T0 + 10,
        world_size=1,
    )["order_id"]  # fmt: skip
    w.do("worker", "bid", price=70, capacity=1, stake=0)
    out = w.do("consumer", "match", order_id=oid)
    assert "ranks" not in out and out["price"] == 70
    assert "world_size" not in w.m.show(oid)


def test_release_pays_each_rank_its_share(cl: Cluster) -> None:
    oid, _ = cl.accepted()
    verify = [e for e in cl.w.m.ledger.events() if e[3]["kind"] == "verify"][-1][3]["data"]
    assert verify["shares"] == [83, 77] and verify["batch_size"] == 33
    out = cl.w.at(T0 + 120).settle(oid)
    assert out["outcome"] == "released"
    assert [r["paid"] for r in out["ranks_out"]] == [83, 77]
    assert cl.bal("worker") == 1000 + 83 and cl.bal("worker2") == 1000 + 77
    assert cl.bal("consumer") == 1000 - 160
    assert cl.w.m.holding(rank_stake(oid, 0)) == cl.w.m.holding(rank_stake(oid, 1)) == 0
    assert [r["outcome"] for r in cl.w.m.show(oid)["ranks"]] == ["returned", "returned"]
    report = cl.w.m.audit(check_bls=False)
    assert report.ok, report.problems


def test_rejection_slashes_only_the_blamed_rank(cl: Cluster) -> None:
    oid, bundle = cl.submitted(forged=True, blame=[1])
    out = cl.w.at(T0 + 10).verify_result(oid, bundle, cl.job)
    assert out["verdict"] == "reject" and out["blame"] == [1]
    assert cl.bal("worker2") == 1000 - 40  # rank 1's stake went to the consumer
    assert cl.bal("worker") == 1000  # rank 0's stake came back; nobody was paid
    assert cl.bal("consumer") == 1000 + 40
    assert [r["outcome"] for r in cl.w.m.show(oid)["ranks"]] == ["returned", "slashed"]
    assert cl.w.m.audit(check_bls=False).ok


def test_an_unattributed_rejection_slashes_rank_0(cl: Cluster) -> None:
    oid, bundle = cl.submitted(forged=True)
    out = cl.w.at(T0 + 10).verify_result(oid, bundle, cl.job)
    assert out["verdict"] == "reject" and out["blame"] == []
    assert cl.bal("worker") == 1000 - 30 and cl.bal("worker2") == 1000
    assert cl.w.m.audit(check_bls=False).ok


@pytest.mark.parametrize("blame", [[2], [1, 1], ["1"], [True], 1])
def test_a_malformed_blame_is_inconclusive(cl: Cluster, blame: Any) -> None:
    oid, bundle = cl.submitted(forged=True, blame=blame)
    out = cl.w.at(T0 + 10).verify_result(oid, bundle, cl.job)
    assert out["verdict"] == "inconclusive" and "BAD_BLAME" in out["reasons"]
    assert cl.w.m.order(oid)["state"] == "submitted"
    assert cl.w.m.holding(rank_stake(oid, 1)) == 40 and cl.w.m.holding(f"escrow:{oid}") == 160


def test_upheld_challenge_slashes_only_the_blamed_rank(cl: Cluster) -> None:
    oid, bundle = cl.accepted(bad_intervals=[2], replay_blame=[1])
    cid = cl.w.do("challenger", "challenge", now=T0 + 30, order_id=oid, bond=5, interval=2)[
        "challenge_id"
    ]
    out = cl.w.at(T0 + 40).resolve_challenge(cid, bundle, cl.job)
    assert out["upheld"] and out["blame"] == [1]
    # rank 1's stake and both attesters' validator stakes; rank 0 keeps its own stake
    assert cl.bal("challenger") == 1000 + 40 + 2 * 100
    assert cl.bal("worker") == 1000 and cl.bal("worker2") == 1000 - 40
    assert cl.bal("consumer") == 1000
    assert cl.w.m.audit(check_bls=False).ok


@pytest.mark.parametrize(("blame", "guilty"), [([1], [1]), ([], [0])])
def test_a_true_whistle_slashes_only_the_blamed_rank(
    cl: Cluster, blame: list[int], guilty: list[int]
) -> None:
    """SPEC V §13.2 with §14.5: the attesters lose their stakes to the whistleblower, and of
    the ranks only the blamed one (rank 0 when none is named); the others keep theirs."""
    oid, bundle = cl.accepted(bad_intervals=[1], replay_blame=blame)
    stakes = [30, 40]
    wid = cl.w.do("challenger", "whistle", now=T0 + 30, order_id=oid, interval=1, deposit=20)[
        "whistle_id"
    ]
    out = cl.w.at(T0 + 40).resolve_whistle(wid, bundle, cl.job)
    assert out["upheld"] and out["blame"] == blame
    taken = sum(stakes[r] for r in guilty)
    assert out["worker_stake"] == taken and out["reward"] == taken + 2 * 100
    assert cl.bal("challenger") == 1000 + taken + 2 * 100
    assert [cl.bal(n) for n in ("worker", "worker2")] == [
        1000 - (stakes[r] if r in guilty else 0) for r in range(2)
    ]
    assert cl.bal("consumer") == 1000  # the escrow came back
    outcomes = ["slashed" if r in guilty else "returned" for r in range(2)]
    assert [r["outcome"] for r in cl.w.m.show(oid)["ranks"]] == outcomes
    assert all(cl.w.m.holding(rank_stake(oid, r)) == 0 for r in range(2))
    report = cl.w.m.audit(check_bls=False)
    assert report.ok, report.problems


def test_the_jackpot_tops_up_what_the_blamed_rank_and_attesters_leave(tmp_path: Path) -> None:
    """SPEC V §13.3 on a cluster: the reward counts the guilty rank's stake, not the others'."""
    m = new_market(
        tmp_path / "m.db",
        verify=cluster_verify,
        replay=cluster_replay,
        config=market_config(whistle_payout=260),
    )
    try:
        cl = Cluster(m, tmp_path)
        oid, bundle = cl.accepted(bad_intervals=[1], replay_blame=[1])
        false = cl.w.do("worker3", "whistle", now=T0 + 30, order_id=oid, interval=0, deposit=50)
        assert not cl.w.at(T0 + 31).resolve_whistle(false["whistle_id"], bundle, cl.job)["upheld"]
        wid = cl.w.do("challenger", "whistle", now=T0 + 32, order_id=oid, interval=1, deposit=20)
        out = cl.w.at(T0 + 40).resolve_whistle(wid["whistle_id"], bundle, cl.job)
        assert out["upheld"] and out["worker_stake"] == 40  # rank 1's stake, not rank 0's 30
        assert out["top_up"] == 260 - 40 - 200 and out["reward"] == 260
        report = m.audit(check_bls=False)
        assert report.ok, report.problems
    finally:
        m.close()


def test_a_whistle_with_a_malformed_blame_is_inconclusive(cl: Cluster) -> None:
    oid, bundle = cl.accepted(bad_intervals=[1], replay_blame=[5])
    wid = cl.w.do("challenger", "whistle", now=T0 + 30, order_id=oid, interval=1, deposit=20)[
        "whistle_id"
    ]
    out = cl.w.at(T0 + 40).resolve_whistle(wid, bundle, cl.job)
    assert out["verdict"] == "inconclusive" and not out["upheld"]
    assert cl.w.m.holding(rank_stake(oid, 1)) == 40 and cl.w.m.order(oid)["state"] == "accepted"


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("swapped", "not the order's workers"),
        ("no_signatures", "rank_signatures"),
        ("out_of_order", "in order"),
    ],
)
def test_the_bundle_must_be_the_orders_cluster(cl: Cluster, case: str, why: str) -> None:
    oid, _ = cl.matched()
    k = cl.keys
    keys = [k["worker"], k["worker3"] if case == "swapped" else k["worker2"]]
    bundle = cluster_bundle(cl.w.tmp / "b", cl.job.job_id, keys)
    manifest = json.loads((bundle / "manifest.json").read_text())
    if case == "no_signatures":
        del manifest["rank_signatures"]
    if case == "out_of_order":
        manifest["ext"]["ranks"][0]["rank"], manifest["ext"]["ranks"][1]["rank"] = 1, 0
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    cl.w.do("worker", "submit", order_id=oid, **bundle_commitment(bundle))
    cl.w.share(oid)
    with pytest.raises(MarketRefused) as e:
        cl.w.at(T0 + 10).verify_result(oid, bundle, cl.job)
    assert e.value.reason == "BUNDLE_MISMATCH" and why in str(e.value)


def test_a_rank_cannot_be_framed_by_a_bundle_it_did_not_sign(cl: Cluster) -> None:
    k = cl.keys
    oid, bundle = cl.submitted(signers=[k["worker"], k["worker"]], forged=True, blame=[1])
    with pytest.raises(MarketRefused) as e:
        cl.w.at(T0 + 10).verify_result(oid, bundle, cl.job)
    assert e.value.reason == "BUNDLE_MISMATCH" and "rank 1 did not sign" in str(e.value)
    assert cl.w.m.holding(rank_stake(oid, 1)) == 40


def test_the_job_must_ask_for_the_orders_world_size(cl: Cluster) -> None:
    oid, bundle = cl.submitted()
    other = ClusterJob(cl.job.job_id, {"world_size": 3, "batch_size": 33})
    with pytest.raises(MarketRefused) as e:
        cl.w.at(T0 + 10).verify_result(oid, bundle, other)
    assert e.value.reason == "JOB_MISMATCH"


def test_timeouts(cl: Cluster) -> None:
    oid, _ = cl.matched()  # nobody delivers: every rank's stake goes to the consumer
    assert cl.w.at(T0 + 1000).settle(oid)["outcome"] == "timed_out"
    assert cl.bal("consumer") == 1000 + 30 + 40
    assert cl.bal("worker") == 1000 - 30 and cl.bal("worker2") == 1000 - 40
    assert cl.w.m.audit(check_bls=False).ok


def test_a_delivered_cluster_timing_out_gets_its_stakes_back(cl: Cluster) -> None:
    oid, _ = cl.submitted()
    assert cl.w.at(T0 + 1000).settle(oid)["outcome"] == "timed_out"
    assert cl.bal("worker") == 1000 and cl.bal("worker2") == 1000 and cl.bal("consumer") == 1000
    assert cl.w.m.audit(check_bls=False).ok


def test_three_ranks_and_a_redraw_exclude_every_worker(tmp_path: Path) -> None:
    m = new_market(tmp_path / "m.db", verify=cluster_verify, replay=cluster_replay)
    cl = Cluster(m, tmp_path, world_size=3, batch_size=33)
    w = cl.w
    w.sk["worker3"] = 2000
    w.register(["worker3"])  # a validator too: it must never be drawn for its own order
    oid = cl.order(max_price=300)
    for n, price in (("worker", 70), ("worker2", 80), ("worker3", 90)):
        w.do(n, "bid", price=price, capacity=1, stake=20)
    out = w.do("consumer", "match", order_id=oid)
    assert out["price"] == 270 and len(out["ranks"]) == 3
    assert sorted(out["validators"]) == sorted(cl.acct(v) for v in ("v1", "v2", "v3"))
    bundle = cluster_bundle(
        tmp_path / "b3", cl.job.job_id, [cl.keys[n] for n in ("worker", "worker2", "worker3")]
    )
    w.do("worker", "submit", order_id=oid, **bundle_commitment(bundle))
    by_account = {c.account: n for n, c in w.c.items()}
    drawn = [by_account[v] for v in out["validators"]]
    w.share(oid, drawn[:2])
    redrawn = w.at(T0 + 600).redraw(oid)  # the only candidate left is worker3: none is drawn
    assert [by_account[v] for v in redrawn["validators"]] == drawn[:2]
    assert w.at(T0 + 601).verify_result(oid, bundle, cl.job)["shares"] == [90, 90, 90]
    w.attest(oid, drawn[:2], now=T0 + 601)
    w.at(T0 + 602).accept(oid)
    w.at(T0 + 702).settle(oid)
    assert [cl.bal(n) for n in ("worker", "worker2", "worker3")] == [1090, 1090, 990]
    report = m.audit(check_bls=False)
    assert report.ok, report.problems
    m.close()


WORKERS = ("worker", "worker2", "worker3", "worker4")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.integers(2, 4),
    batch=st.integers(1, 40),
    bids=st.lists(st.tuples(st.integers(1, 50), st.integers(0, 60)), min_size=4, max_size=4),
    outcome=st.sampled_from(["release", "reject", "challenge", "timeout", "late"]),
    blame=st.sets(st.integers(0, 3), max_size=3),
)
def test_any_cluster_outcome_conserves_money_and_audits(
    size: int,
    batch: int,
    bids: list[tuple[int, int]],
    outcome: str,
    blame: set[int],
) -> None:
    """Split payments and per-rank slashes, against a model of who gets what."""
    blamed = sorted(r for r in blame if r < size)
    with tempfile.TemporaryDirectory() as d:
        m = new_market(Path(d) / "m.db", verify=cluster_verify, replay=cluster_replay)
        try:
            cl = Cluster(m, Path(d), world_size=size, batch_size=batch)
            w = cl.w
            w.c["worker4"] = Client(key(31), m.market_id)
            cl.keys["worker4"] = key(31)
            w.do("worker4", "deposit", amount=1000)
            names = WORKERS[:size]
            oid = cl.order(max_price=50 * size + 7)
            for n, (price, stake) in zip(names, bids, strict=False):
                w.do(n, "bid", price=price, capacity=1, stake=max(stake, 20))
            out = w.do("consumer", "match", order_id=oid)
            by_account = {c.account: n for n, c in w.c.items()}
            ranks = [by_account[r["worker"]] for r in out["ranks"]]
            order = sorted(names, key=lambda n: (bids[names.index(n)][0], names.index(n)))
            assert ranks == order
            stake = {n: max(bids[names.index(n)][1], 20) for n in names}
            price = size * max(bids[names.index(n)][0] for n in names)
            assert out["price"] == price
            want = {n: 1000 for n in (*names, "consumer", "challenger")}
            want["consumer"] -= price
            flags: dict[str, Any] = {"forged": outcome == "reject", "blame": blamed}
            if outcome == "challenge":
                flags.update(bad_intervals=[1], replay_blame=blamed)
            if outcome != "timeout":
                bundle = cluster_bundle(
                    Path(d) / "b", cl.job.job_id, [cl.keys[n] for n in ranks], **flags
                )
                w.do(ranks[0], "submit", order_id=oid, **bundle_commitment(bundle))
                w.share(oid)
            guilty = [ranks[r] for r in (blamed or [0])]
            if outcome == "timeout":
                w.at(T0 + 1000).settle(oid)
                want["consumer"] += price + sum(stake.values())
                for n in names:
                    want[n] -= stake[n]
            elif outcome == "late":
                w.at(T0 + 1000).settle(oid)
                want["consumer"] += price
            elif outcome == "reject":
                assert w.at(T0 + 10).verify_result(oid, bundle, cl.job)["verdict"] == "reject"
                want["consumer"] += price + sum(stake[n] for n in guilty)
                for n in guilty:
                    want[n] -= stake[n]
            else:
                w.at(T0 + 10).verify_result(oid, bundle, cl.job)
                w.attest(oid, ["v1", "v2"])
                w.at(T0 + 20).accept(oid)
                if outcome == "release":
                    w.at(T0 + 120).settle(oid)
                    for n, share in zip(ranks, rank_shares(price, size, batch), strict=True):
                        want[n] += share
                else:
                    cid = w.do(
                        "challenger", "challenge", now=T0 + 30, order_id=oid, bond=5, interval=1
                    )["challenge_id"]
                    assert w.at(T0 + 40).resolve_challenge(cid, bundle, cl.job)["upheld"]
                    want["consumer"] += price
                    want["challenger"] += sum(stake[n] for n in guilty) + 2 * 100
                    for n in guilty:
                        want[n] -= stake[n]
            assert {n: cl.bal(n) for n in want} == want
            assert all(m.holding(rank_stake(oid, r)) == 0 for r in range(size))
            assert m.holding(f"escrow:{oid}") == 0
            report = m.audit(check_bls=False)
            assert report.ok, report.problems
        finally:
            m.close()


def test_no_rank_of_a_cluster_challenges_or_whistles_on_its_own_order(tmp_path: Path) -> None:
    """SPEC V §6, §14.2: every rank is a worker on the order; a guilty rank 1 challenging its
    own fake would take its own stake back and the attesters' stakes (+240 instead of -40)."""
    m = new_market(tmp_path / "m.db", verify=cluster_verify, replay=cluster_replay)
    cl = Cluster(m, tmp_path)
    oid, _ = cl.accepted(bad_intervals=[1], replay_blame=[1])
    for action, extra in (("challenge", {"bond": 5}), ("whistle", {"deposit": 50})):
        with pytest.raises(MarketRefused) as e:
            cl.w.do("worker2", action, now=T0 + 21, order_id=oid, interval=1, **extra)
        assert e.value.reason == "SELF_CHALLENGE", action
