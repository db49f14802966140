"""Cluster orders with real two-rank bundles and the real verifier (SPEC Part V §14 over
Part I §8.5, §11.6, §12.6): a stale rank is blamed and slashed alone; an honest cluster is
paid by its shares. Runs where the data-parallel training (``dk.dist``) is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

train_threads = pytest.importorskip("dk.dist.local").train_threads

from market_support import T0, World, key, new_market  # noqa: E402
from tests.helpers import tiny_job  # noqa: E402

from dk.market import Client, bundle_commitment  # noqa: E402
from dk.market.cluster import rank_shares  # noqa: E402
from dk.market.cluster_flow import rank_stake  # noqa: E402


def _bundle(tmp: Path, keys: list[Any], fault: Any = None) -> tuple[Any, Path]:
    from dk.prover import prove_run

    job = tiny_job().with_updates(train={"world_size": 2})
    train_threads(job, tmp / "run", keys, faults={1: fault} if fault else None)
    return job, prove_run(tmp / "run", job, keys[0], tmp / "bundle")


def _stale(t: int, r: int, fresh: Any, previous: Any) -> Any:
    return previous if previous is not None and t >= 7 else fresh  # skips its shard from step 7


@pytest.mark.slow
@pytest.mark.parametrize("fault", [None, _stale], ids=["honest", "stale-rank-1"])
def test_a_real_two_rank_bundle_through_the_market(tmp_path: Path, fault: Any) -> None:
    m = new_market(tmp_path / "m.db", verify=None, replay=None)  # the real verifier
    try:
        w = World(m, tmp_path)
        keys = [key(2), key(3)]  # worker and worker2: ranks 0 and 1
        job, bundle = _bundle(tmp_path, keys, fault)
        oid = w.do(
            "consumer", "order", job_id=job.job_id.hex(), max_price=200, min_stake=20,
            deadline=T0 + 1000, world_size=2, policy={"samples": 4},
        )["order_id"]  # fmt: skip
        w.do("worker", "bid", price=70, capacity=1, stake=30)
        w.do("worker2", "bid", price=80, capacity=1, stake=40)
        w.do("consumer", "match", order_id=oid)
        w.do("worker", "submit", order_id=oid, **bundle_commitment(bundle))
        w.share(oid)
        out = w.at(T0 + 10).verify_result(oid, bundle, job)
        acct = {n: Client(k, m.market_id).account for n, k in zip(("w0", "w1"), keys, strict=True)}
        if fault is None:
            assert out["verdict"] == "accept" and out["shares"] == rank_shares(160, 2, 16)
            w.attest(oid, ["v1", "v2"])
            w.at(T0 + 20).accept(oid)
            w.at(T0 + 120).settle(oid)
            assert m.balance(acct["w0"]) == m.balance(acct["w1"]) == 1080
        else:
            assert out["verdict"] == "reject" and out["blame"] == [1]
            assert m.balance(acct["w0"]) == 1000  # rank 0 did its part: stake back, unpaid
            assert m.balance(acct["w1"]) == 1000 - 40  # rank 1 skipped its shard: slashed
            assert m.balance(w.c["consumer"].account) == 1000 + 40
        assert m.holding(rank_stake(oid, 0)) == m.holding(rank_stake(oid, 1)) == 0
        report = m.audit(check_bls=False)
        assert report.ok, report.problems
    finally:
        m.close()


@pytest.mark.slow
def test_served_cluster_demo(tmp_path: Path) -> None:
    """``make demo``'s step 9 on the tiny job: every party a process, the server verifies."""
    pytest.importorskip("uvicorn")
    from dk.market.demo_server import run_served_cluster_demo

    keys = [key(2), key(3)]
    files = [tmp_path / "rank-0.key", tmp_path / "rank-1.key"]
    for k, f in zip(keys, files, strict=True):
        k.save(f)
    job, bundle = _bundle(tmp_path, keys)
    (tmp_path / "job.toml").write_text(job.to_toml())
    lines: list[str] = []
    assert run_served_cluster_demo(
        bundle, tmp_path / "job.toml", tmp_path / "m", lines.append, rank_keys=files
    ), lines
    text = "\n".join(lines)
    assert "a cluster of 2 workers" in text and "rank 1 → rank-1" in text
    assert "shares [100, 100]" in text
    assert "released; rank-0 balance 1100, rank-1 balance 1100, consumer 800" in text
    assert any("audit --url: clean" in line for line in lines)


@pytest.mark.slow
def test_an_upheld_challenge_slashes_the_stale_rank_alone(tmp_path: Path) -> None:
    """The dispute replay of a real two-rank bundle blames rank 1 (Part I §12.6): the
    challenger gets rank 1's stake and the attesters' stakes, rank 0 keeps its own."""
    from market_support import FakeReport

    def accepting(*args: Any, **kwargs: Any) -> Any:  # a market verifier that missed it
        return FakeReport(True, {"missed": True})

    m = new_market(tmp_path / "m.db", verify=accepting, replay=None)  # the real replay
    try:
        w = World(m, tmp_path)
        job, bundle = _bundle(tmp_path, [key(2), key(3)], _stale)
        oid = w.do(
            "consumer", "order", job_id=job.job_id.hex(), max_price=200, min_stake=20,
            deadline=T0 + 1000, world_size=2, policy={"samples": 1},
        )["order_id"]  # fmt: skip
        w.do("worker", "bid", price=70, capacity=1, stake=30)
        w.do("worker2", "bid", price=80, capacity=1, stake=40)
        w.do("consumer", "match", order_id=oid)
        w.do("worker", "submit", order_id=oid, **bundle_commitment(bundle))
        w.share(oid)
        assert w.at(T0 + 10).verify_result(oid, bundle, job)["verdict"] == "accept"
        w.attest(oid, ["v1", "v2"])
        w.at(T0 + 20).accept(oid)
        cid = w.do("challenger", "challenge", now=T0 + 30, order_id=oid, bond=5, interval=2)[
            "challenge_id"
        ]
        out = w.at(T0 + 40).resolve_challenge(cid, bundle, job)
        assert out["upheld"] and out["blame"] == [1]
        assert m.balance(w.c["challenger"].account) == 1000 + 40 + 2 * 100
        assert m.balance(w.c["worker"].account) == 1000
        assert m.balance(w.c["worker2"].account) == 1000 - 40
        report = m.audit(check_bls=False)
        assert report.ok, report.problems
    finally:
        m.close()
