"""``dk market order --gflop-price / --profiles``, ``profile``, ``whistle``, ``treasury`` and
``explain``'s new tables, in process on a test-clock ledger (SPEC V §11-§13)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dk.cli.app import App, cli
from dk.crypto.keys import SigningKey
from dk.market import BlsKey
from dk.pol.jobinit import default_job

NOW = "1700000000"


def dk(db: Path, *args: object, code: int = 0) -> Any:
    res = CliRunner().invoke(
        cli, ["market", *map(str, args), "--db", str(db), "--now", NOW, "--json"], obj=App()
    )
    assert res.exit_code == code, res.output
    return json.loads(res.output) if code == 0 else res.output


@pytest.fixture
def ledger(tmp_path: Path) -> tuple[Path, dict[str, Path], Path]:
    db = tmp_path / "m.db"
    dk(db, "init", "--clock", "test", "--k", "1", "--n", "1")
    keys = {}
    for i, name in enumerate(["consumer", "v1", "v2", "v3", "outsider"]):
        keys[name] = tmp_path / f"{name}.key"
        SigningKey(bytes([60 + i]) * 32).save(keys[name])
        dk(db, "deposit", "--key", keys[name], 1000)
    for name in ("v1", "v2", "v3"):
        bls = tmp_path / f"{name}.bls"
        BlsKey.from_seed(bytes([70 + len(name) + int(name[1])]) * 32).save(bls)
        dk(db, "register-validator", "--key", keys[name], "--bls-key", bls)
    job = tmp_path / "job.toml"
    job.write_text(default_job(steps=40, interval=10, hidden=[16]).to_toml())
    return db, keys, job


def test_order_prices_the_work_and_profiles_fix_the_tolerance(
    ledger: tuple[Path, dict[str, Path], Path], tmp_path: Path
) -> None:
    db, keys, job = ledger
    out = dk(
        db, "order", "--key", keys["consumer"], "--job", job, "--deadline", 600,
        "--profiles", 3, "--gflop-price", 1000,
    )  # fmt: skip
    est, oid = out["estimate"], out["order_id"]
    assert out["fee"] == est["fee"] > 0 and out["fee_intervals"] == est["fee_intervals"]
    assert est["max_price"] >= 1 and est["train_flops"] == est["flops_per_step"] * 40
    for name, t in (("v1", 0.01), ("v2", 0.02), ("v3", 5.0)):
        cal = tmp_path / f"{name}.json"
        cal.write_text(json.dumps({"max_l2": t / 10, "recommended_tolerance": t}))
        got = dk(db, "profile", "--key", keys[name], oid, "--calibration", cal)
        assert got["tolerance"] == t and got["deposit"] == 10
    bad = dk(db, "profile", "--key", keys["outsider"], oid, "--calibration", cal, code=1)
    assert "NOT_VALIDATOR" in bad and len(bad.strip().splitlines()) == 1
    shown = dk(db, "show", oid)
    assert [p["state"] for p in shown["profiles"]] == ["posted"] * 3
    explained = dk(db, "explain", oid, "--intervals", 4)
    assert explained["tolerance"]["median"] == 0.02 and explained["tolerance"]["fixed"] is None
    assert explained["escrow"]["locked_at_order"] == est["max_price"] + est["fee"]
    res = CliRunner().invoke(
        cli, ["market", "explain", oid, "--intervals", "4", "--db", str(db), "--now", NOW],
        obj=App(),
    )  # fmt: skip
    assert res.exit_code == 0
    for text in ("tolerance: not fixed yet", "escrow (SPEC V §11)", "whistles"):
        assert text in res.output
    assert dk(db, "treasury") == {
        "in": {}, "out": {}, "total_in": 0, "total_out": 0, "balance": 0, "conserved": True,
        "held": 0,
    }  # fmt: skip
    assert dk(db, "audit", "--no-bls")["ok"]


def test_whistle_and_order_usage_errors(ledger: tuple[Path, dict[str, Path], Path]) -> None:
    db, keys, job = ledger
    oid = dk(
        db, "order", "--key", keys["consumer"], "--job", job, "--deadline", 600,
        "--max-price", 50, "--fee", 5, "--fee-intervals", 2,
    )["order_id"]  # fmt: skip
    assert dk(db, "show", oid)["escrow"] == 55
    out = dk(
        db, "whistle", "--key", keys["outsider"], oid, "--deposit", 10, "--interval", 0, code=1
    )
    assert "BAD_STATE" in out  # not accepted
    dk(db, "whistle", "--key", keys["outsider"], oid, "--deposit", 10, code=2)  # no interval
    dk(db, "order", "--key", keys["consumer"], "--job", job, "--deadline", 9, code=2)  # no price
    dk(
        db, "order", "--key", keys["consumer"], "--job", job, "--deadline", 9,
        "--max-price", 5, "--fee", 3, code=2,
    )  # fmt: skip
    out = dk(db, "resolve-whistle", "w99", str(job.parent), "--job", job, code=1)
    assert "UNKNOWN_WHISTLE" in out


def test_a_local_submit_checks_the_bundle_before_committing(
    ledger: tuple[Path, dict[str, Path], Path], tmp_path: Path
) -> None:
    """A bundle of another job was committed (the order stuck: the right bundle was then
    BAD_STATE, the committed one BUNDLE_MISMATCH at verify); now it is refused at submit."""
    from market_support import make_bundle

    from dk.pol.job import load_job

    db, keys, job = ledger
    worker = tmp_path / "w.key"
    SigningKey(bytes([90]) * 32).save(worker)
    account = SigningKey(bytes([90]) * 32).verify_key.hex()
    dk(db, "deposit", "--key", worker, 1000)
    oid = dk(
        db, "order", "--key", keys["consumer"], "--job", job, "--deadline", 600,
        "--max-price", 100,
    )["order_id"]  # fmt: skip
    dk(db, "bid", "--key", worker, "--price", 80, "--stake", 10)
    dk(db, "match", "--key", keys["consumer"], oid)
    other = make_bundle(tmp_path / "other", bytes(32), account)  # another job's bundle
    out = dk(db, "submit", "--key", worker, oid, other, code=1)
    assert "BUNDLE_MISMATCH" in out
    assert dk(db, "show", oid)["state"] == "matched"
    mine = make_bundle(tmp_path / "mine", load_job(job).job_id, account)
    dk(db, "submit", "--key", worker, oid, mine)
    assert dk(db, "show", oid)["state"] == "submitted"


def test_explain_takes_a_run_s_intervals_and_no_more(
    ledger: tuple[Path, dict[str, Path], Path],
) -> None:
    """``--intervals`` past a run's largest (SPEC I §11.2: 100 000 checkpoints) is a usage error,
    and the library refuses it too; the largest is answered (it took minutes: the search for
    the economic ``s`` checked ``s`` near ``m/2`` first)."""
    from dk.market import Market, MarketRefused
    from dk.pol.transcript import MAX_CHECKPOINTS

    db, keys, job = ledger
    oid = dk(
        db, "order", "--key", keys["consumer"], "--job", job, "--deadline", 600, "--max-price", 50
    )["order_id"]
    most = MAX_CHECKPOINTS - 1
    assert dk(db, "explain", oid, "--intervals", most)["m"] == most
    out = dk(db, "explain", oid, "--intervals", most + 1, code=2)
    assert "--intervals" in out and "Traceback" not in out
    with Market(db) as m, pytest.raises(MarketRefused) as e:
        m.explain(oid, intervals=most + 1)
    assert e.value.reason == "BAD_PARAMS"
