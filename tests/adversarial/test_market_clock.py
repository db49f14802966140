"""Attack: a party sets the market's time (issue 10, item 3).

Before the fix every ``dk market`` command took ``--now`` from the caller and the ledger trusted
it: a consumer ran ``settle --now <after the deadline>`` right after the match and took the
worker's stake as "timed out"; a worker settled with ``--now <window end>`` to close the
challenge window early. Now a production ledger (``clock = "system"``) keeps its own time and
refuses ``--now`` with exit code 2; only a ledger created for tests accepts one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.unit.market.market_support import (
    FakeBls,
    FakeJob,
    fake_replay,
    fake_verify,
    key,
    make_bundle,
)

from dk.cli.app import cli
from dk.market import Client, Market, MarketConfig, MarketRefused, bundle_commitment
from dk.market.attest import attestation_message
from dk.market.beacon import members, order_share_message

FAR = 10**12  # a time far after every deadline and window


class Prod:
    """A production ledger (system clock) driven through the library with test doubles."""

    def __init__(self, tmp: Path) -> None:
        self.db = tmp / "prod.db"
        cfg = MarketConfig(k=2, n=3, window=3600, clock="system")
        self.m = Market.create(
            self.db, config=cfg, verify=fake_verify, replay=fake_replay, bls=FakeBls()
        )
        names = ["consumer", "worker", "v1", "v2", "v3", "challenger"]
        self.keys = {n: key(i + 1) for i, n in enumerate(names)}
        self.c = {n: Client(k, self.m.market_id) for n, k in self.keys.items()}
        self.sk = {n: 700 + i for i, n in enumerate(names)}
        self.files = {}
        for n, k in self.keys.items():
            self.files[n] = str(tmp / f"{n}.key")
            k.save(self.files[n])
            self.do(n, "deposit", amount=1000)
        for n in ("v1", "v2", "v3"):
            bls = self.m.bls
            self.do(
                n,
                "register_validator",
                bls_pk=bls.sk_to_pk(self.sk[n]).hex(),
                pop=bls.pop_prove(self.sk[n]).hex(),
                stake=100,
            )
        self.job = FakeJob(bytes(range(32)))
        self.oid = self.do(
            "consumer",
            "order",
            job_id=self.job.job_id.hex(),
            max_price=100,
            min_stake=50,
            deadline=int(time.time()) + 3600,
        )["order_id"]
        self.do("worker", "bid", price=80, capacity=1, stake=60)
        self.do("consumer", "match", order_id=self.oid)
        self.bundle = make_bundle(tmp / "bundle", self.job.job_id, self.c["worker"].account)

    def do(self, who: str, action: str, **params: object) -> dict:
        return self.m.execute(self.c[who].request(action, **params))

    def to_accepted(self) -> None:
        self.do("worker", "submit", order_id=self.oid, **bundle_commitment(self.bundle))
        order = self.m.order(self.oid)
        by_account = {c.account: n for n, c in self.c.items()}
        msg = order_share_message(self.m.market_id, order)
        for v in members(order):
            n = by_account[v]
            self.do(
                n,
                "beacon_share",
                order_id=self.oid,
                signature=self.m.bls.sign(self.sk[n], msg).hex(),
            )
        digest = self.m.verify_result(self.oid, self.bundle, self.job)["report_digest"]
        msg = attestation_message(self.m.market_id, self.oid, bytes.fromhex(digest))
        for n in ("v1", "v2"):
            self.do(
                n,
                "attest",
                order_id=self.oid,
                report_digest=digest,
                signature=self.m.bls.sign(self.sk[n], msg).hex(),
            )
        self.m.accept(self.oid)

    def holdings(self) -> dict[str, int]:
        return dict(self.m.ledger.con.execute("SELECT holder, amount FROM holdings"))

    def cli(self, *args: str) -> tuple[int, str]:
        res = CliRunner().invoke(cli, ["market", *args, "--db", str(self.db)])
        return res.exit_code, res.output


def test_production_ledger_refuses_an_injected_clock(tmp_path: Path) -> None:
    prod = Prod(tmp_path)
    with pytest.raises(MarketRefused) as e:
        Market(prod.db, clock=lambda: FAR)
    assert e.value.reason == "CLOCK_LOCKED"


def test_consumer_cannot_take_the_stake_with_a_future_now(tmp_path: Path) -> None:
    prod = Prod(tmp_path)
    before = prod.holdings()
    code, out = prod.cli("settle", prod.oid, "--now", str(FAR))
    assert code == 2, out
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) == 1 and "CLOCK_LOCKED" in lines[0] and "Traceback" not in out
    code, out = prod.cli("settle", prod.oid)  # on the ledger's own clock: not yet
    assert code == 1 and "NOT_SETTLEABLE" in out
    assert prod.holdings() == before and prod.m.order(prod.oid)["state"] == "matched"
    assert prod.m.holding(f"stake:{prod.oid}") == 60
    assert prod.m.audit().ok


def test_worker_cannot_close_the_challenge_window_early(tmp_path: Path) -> None:
    prod = Prod(tmp_path)
    prod.to_accepted()
    window_end = prod.m.order(prod.oid)["window_end"]
    code, out = prod.cli("settle", prod.oid, "--now", str(window_end), "--json")
    assert code == 2 and "CLOCK_LOCKED" in out
    code, out = prod.cli("settle", prod.oid)
    assert code == 1 and "NOT_SETTLEABLE" in out
    assert prod.m.order(prod.oid)["state"] == "accepted"
    # the window is still open: a challenger can dispute the result
    cid = prod.do("challenger", "challenge", order_id=prod.oid, bond=5, interval=1)
    assert cid["challenge_id"].startswith("c")


def test_init_with_now_needs_a_test_clock(tmp_path: Path) -> None:
    runner = CliRunner()
    db = str(tmp_path / "x.db")
    res = runner.invoke(cli, ["market", "init", "--db", db, "--now", "5"])
    assert res.exit_code == 2 and "CLOCK_LOCKED" in res.output
    assert not Path(db).exists()  # refused before anything was written
    res = runner.invoke(
        cli, ["market", "init", "--db", db, "--now", "5", "--clock", "test", "--json"]
    )
    assert res.exit_code == 0 and json.loads(res.output)["clock"] == "test"
