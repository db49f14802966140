"""An order with no ``samples`` gets the economic default, fixed at verification (SPEC V §10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from market_support import T0, World, new_market, running

from dk.cli.app import cli
from dk.market import MarketRefused
from dk.market.economics import economic_samples, explain, order_samples


def test_an_order_without_samples_gets_the_economic_default(tmp_path: Path) -> None:
    w = World(new_market(tmp_path / "m.db"), tmp_path)
    oid, bundle = w.to_submitted()  # price 80, stake 60, m = 4 intervals
    assert json.loads(w.m.order(oid)["policy"])["samples"] is None  # not fixed before
    w.share(oid)
    out = w.at(T0 + 10).verify_result(oid, bundle, w.job)
    expected = order_samples(4, 80, 60, w.m.config.samples)
    assert expected == economic_samples(4, 80, 60) == 4 != w.m.config.samples
    assert out["report"]["s"] == expected  # the verifier replayed that many
    assert (out["samples"], out["intervals"]) == (expected, 4)  # recorded in the event
    policy = json.loads(w.m.order(oid)["policy"])
    assert (policy["samples"], policy["intervals"]) == (expected, 4)  # validators read it
    w.attest(oid, ["v1", "v2"])
    w.at(T0 + 20).accept(oid)
    w.at(T0 + 200).settle(oid)
    assert w.m.audit(check_bls=False).ok


def test_an_order_that_gives_samples_keeps_them(tmp_path: Path) -> None:
    w = World(new_market(tmp_path / "m.db"), tmp_path)
    oid = w.do(
        "consumer",
        "order",
        job_id=w.job.job_id.hex(),
        max_price=100,
        min_stake=0,
        deadline=T0 + 1000,
        policy={"samples": 1},
    )["order_id"]
    assert json.loads(w.m.order(oid)["policy"])["samples"] == 1
    out = w.m.explain(oid, intervals=4)
    assert out["samples"] == 1 and out["source"] == "set by the order"


def test_explain_before_and_after_verification(tmp_path: Path) -> None:
    w = World(new_market(tmp_path / "m.db"), tmp_path)
    oid, bundle = w.to_submitted()
    with pytest.raises(MarketRefused) as e:  # m is not known before the verification
        w.m.explain(oid)
    assert e.value.reason == "NEED_INTERVALS"
    before = w.m.explain(oid, intervals=4)
    w.share(oid)
    w.at(T0 + 10).verify_result(oid, bundle, w.job)
    after = w.m.explain(oid)
    assert before["samples"] == after["samples"] == 4 and after["m"] == 4
    assert after["rows"] == explain(4, 80, 60, samples=4).rows
    assert (after["price"], after["stake"]) == (80, 60)


def test_explain_cli(tmp_path: Path) -> None:
    w = World(new_market(tmp_path / "m.db"), tmp_path)
    oid, _ = w.to_submitted()
    w.m.close()
    db = str(tmp_path / "m.db")
    r = CliRunner().invoke(
        cli, ["market", "explain", "--db", db, "--now", str(T0), oid, "--intervals", "40", "--json"]
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["m"] == 40 and out["samples"] == order_samples(40, 80, 60, 2)
    r = CliRunner().invoke(
        cli, ["market", "explain", "--db", db, "--now", str(T0), oid, "--intervals", "40"]
    )
    assert r.exit_code == 0 and "expected loss" in r.output and "'rows'" not in r.output
    r = CliRunner().invoke(cli, ["market", "explain", "--db", db, "--now", str(T0), oid])
    assert r.exit_code == 1 and "NEED_INTERVALS" in r.output


def test_explain_over_http(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    from dk.errors import FormatError
    from dk.market.client import RemoteMarket
    from dk.market.server import MarketService

    w = World(new_market(tmp_path / "m.db"), tmp_path)
    oid, _ = w.to_submitted()
    w.m.close()
    service = MarketService(tmp_path / "m.db", state_dir=tmp_path / "state", clock=lambda: T0)
    with running(service) as url:
        with RemoteMarket(url) as rm:
            out = rm.explain(oid, intervals=40)
            assert out["m"] == 40 and out["samples"] == order_samples(40, 80, 60, 2)
            with pytest.raises(MarketRefused) as e:
                rm.explain(oid)
            assert e.value.reason == "NEED_INTERVALS"
            with pytest.raises(FormatError):
                rm._get(f"/v1/orders/{oid}/explain", intervals="-3")
