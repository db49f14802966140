"""End to end with the real verifier, real bundles and real BLS (py_ecc): honest and forged jobs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from market_support import T0, Clock, key

from dk.cli.app import cli
from dk.crypto.keys import SigningKey
from dk.errors import FormatError
from dk.market import BlsKey, Client, Market, MarketConfig, MarketRefused, bundle_commitment
from dk.market.validator import attestation_request, registration_request, share_request

pytestmark = pytest.mark.slow

WORKER_SEED = bytes([2]) * 32


@pytest.fixture(scope="module")
def job_and_bundles(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A small digits job, an honest bundle and a forged copy (every later checkpoint edited)."""
    from dk.pol import default_job
    from dk.pol.train import train_job
    from dk.prover import prove_run

    d = tmp_path_factory.mktemp("e2e")
    job = default_job(steps=40, interval=10, base_dir=d)
    (d / "job.toml").write_text(job.to_toml())
    train_job(job, d / "run")
    honest = prove_run(d / "run", job, SigningKey(WORKER_SEED), d / "bundle")
    forged = d / "forged"
    shutil.copytree(honest, forged)  # copies bytes, so the honest blobs stay untouched
    manifest = json.loads((forged / "manifest.json").read_text())
    for ck in manifest["checkpoints"][1:]:
        blob = forged / ck["blob"]
        data = bytearray(blob.read_bytes())
        data[-1] ^= 0x01
        blob.write_bytes(bytes(data))
    return d / "job.toml", honest, forged


BLS = {n: BlsKey.from_seed(bytes([i + 1]) * 32) for i, n in enumerate(["v1", "v2", "v3"])}


def _market(path: Path, clock: Clock, k: int) -> Market:
    return Market.create(path, config=MarketConfig(k=k, n=3, window=60, clock="test"), clock=clock)


def _to_submitted(
    m: Market, clock: Clock, job: object, bundle: Path, clients: dict[str, Client]
) -> str:
    """Deposits, three staked validators (v1..v3), order, bid, match, submit, beacon shares."""
    clock.t = T0
    for name in clients:
        m.execute(clients[name].request("deposit", amount=1000))
    for n in ("v1", "v2", "v3"):
        m.execute(registration_request(clients[n], BLS[n], 100))
    oid = m.execute(
        clients["consumer"].request(
            "order",
            job_id=job.job_id.hex(),
            max_price=100,
            min_stake=40,
            deadline=T0 + 1000,
            tags={"region": "eu"},
        )
    )["order_id"]
    m.execute(
        clients["worker"].request("bid", price=90, capacity=1, stake=40, tags={"region": "eu"})
    )
    drawn = m.execute(clients["consumer"].request("match", order_id=oid))["validators"]
    assert sorted(drawn) == sorted(clients[n].account for n in ("v1", "v2", "v3"))
    clock.t = T0 + 1
    m.execute(clients["worker"].request("submit", order_id=oid, **bundle_commitment(bundle)))
    for n in ("v1", "v2", "v3"):
        out = m.execute(share_request(m, clients[n], BLS[n], oid))
    assert out["beacon"] == m.order(oid)["beacon"]
    return oid


def _clients(m: Market, *extra: str) -> dict[str, Client]:
    ids = {
        "consumer": key(1),
        "worker": SigningKey(WORKER_SEED),
        "v1": key(3),
        "v2": key(4),
        "v3": key(5),
        "challenger": key(6),
        "fresh": key(7),
    }
    return {
        n: Client(ids[n], m.market_id) for n in ("consumer", "worker", "v1", "v2", "v3", *extra)
    }


def test_full_honest_job_end_to_end(
    job_and_bundles: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    from dk.pol import load_job

    job_path, honest, _ = job_and_bundles
    job = load_job(job_path)
    clock = Clock()
    m = _market(tmp_path / "m.db", clock, 2)
    clients = _clients(m, "fresh")
    oid = _to_submitted(m, clock, job, honest, clients)
    clock.t = T0 + 2
    out = m.verify_result(oid, honest, job)
    assert out["ok"] and out["verdict"] == "accept" and out["beacon"] == m.order(oid)["beacon"]
    for n in ("v1", "v2"):
        m.execute(attestation_request(m, clients[n], BLS[n], oid, honest, job))
    fresh = BlsKey.from_seed(bytes([9]) * 32)
    m.execute(registration_request(clients["fresh"], fresh, 100))
    with pytest.raises(MarketRefused) as e:  # registered and staked, but not drawn
        m.execute(attestation_request(m, clients["fresh"], fresh, oid, honest, job))
    assert e.value.reason == "NOT_DRAWN"
    clock.t = T0 + 5
    accepted = m.accept(oid)
    assert sorted(accepted["signers"]) == sorted([clients["v1"].account, clients["v2"].account])
    clock.t = T0 + 64
    with pytest.raises(MarketRefused):
        m.settle(oid)
    clock.t = T0 + 65
    assert m.settle(oid)["outcome"] == "released"
    assert m.balance(clients["worker"].account) == 1000 + 90
    assert m.balance(clients["consumer"].account) == 1000 - 90
    report = m.audit()  # re-checks PoPs, shares, the beacon and the aggregate with pairings
    assert report.ok, report.problems
    m.close()


def test_forged_bundle_is_never_paid(
    job_and_bundles: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    from dk.pol import load_job

    job_path, _, forged = job_and_bundles
    job = load_job(job_path)
    clock = Clock()
    m = _market(tmp_path / "m.db", clock, 1)
    clients = _clients(m)
    oid = _to_submitted(m, clock, job, forged, clients)
    clock.t = T0 + 2
    with pytest.raises(FormatError):  # no bundle at all: nothing is recorded
        m.verify_result(oid, tmp_path / "missing", job)
    out = m.verify_result(oid, forged, job)
    assert out["verdict"] == "reject" and out["outcome"] == "rejected" and out["reasons"]
    with pytest.raises(MarketRefused) as e:
        attestation_request(m, clients["v1"], BLS["v1"], oid, forged, job)
    assert e.value.reason == "BAD_STATE"
    with pytest.raises(MarketRefused) as e:
        m.accept(oid)
    assert e.value.reason == "BAD_STATE"
    clock.t = T0 + 5000
    with pytest.raises(MarketRefused) as e:
        m.settle(oid)
    assert e.value.reason == "ALREADY_SETTLED"
    assert m.balance(clients["worker"].account) == 1000 - 40  # stake slashed, never paid
    assert m.balance(clients["consumer"].account) == 1000 + 40
    assert m.audit().ok
    m.close()


def test_cli_runs_a_job(job_and_bundles: tuple[Path, Path, Path], tmp_path: Path) -> None:
    job_path, honest, _ = job_and_bundles
    db = str(tmp_path / "cli.db")
    keys = {}
    for name, k in (("consumer", key(1)), ("worker", SigningKey(WORKER_SEED)), ("v1", key(3))):
        k.save(tmp_path / f"{name}.key")
        keys[name] = str(tmp_path / f"{name}.key")
    runner = CliRunner()

    def dk(*args: str) -> dict:
        res = runner.invoke(
            cli, ["market", *args, "--db", db, "--json", "--now", str(T0)], catch_exceptions=False
        )
        assert res.exit_code == 0, res.output
        return json.loads(res.output)

    init = dk("init", "--k", "1", "--n", "1", "--window", "0", "--clock", "test")
    assert len(init["market_id"]) == 64 and init["clock"] == "test"
    for name in keys:
        dk("deposit", "--key", keys[name], "500")
    BlsKey.from_seed(bytes([9]) * 32).save(tmp_path / "v1.bls")
    assert (
        dk("register-validator", "--key", keys["v1"], "--bls-key", str(tmp_path / "v1.bls"))[
            "stake"
        ]
        == 100
    )
    oid = dk(
        "order",
        "--key",
        keys["consumer"],
        "--job",
        str(job_path),
        "--max-price",
        "100",
        "--deadline",
        "100",
        "--tag",
        "region=eu",
    )["order_id"]
    dk("bid", "--key", keys["worker"], "--price", "60", "--tag", "region=us")
    res = runner.invoke(
        cli, ["market", "match", "--key", keys["consumer"], oid, "--db", db, "--now", str(T0)]
    )
    assert res.exit_code == 1 and "NO_MATCH" in res.output
    shown = dk("show", oid)
    assert shown["bids"][0]["reasons"] == ["TAG_MISMATCH region (us != eu)"]
    dk("bid", "--key", keys["worker"], "--price", "70", "--tag", "region=eu")
    matched = dk("match", "--key", keys["consumer"], oid)
    assert matched["price"] == 70 and matched["validators"] == [key(3).verify_key.hex()]
    dk("submit", "--key", keys["worker"], oid, str(honest))
    assert "beacon" in dk("share", "--key", keys["v1"], "--bls-key", str(tmp_path / "v1.bls"), oid)
    assert dk("verify", oid, str(honest), "--job", str(job_path))["verdict"] == "accept"
    dk(
        "attest",
        "--key",
        keys["v1"],
        "--bls-key",
        str(tmp_path / "v1.bls"),
        "--job",
        str(job_path),
        oid,
        str(honest),
    )
    dk("accept", oid)
    assert dk("settle", oid)["outcome"] == "released"
    res = runner.invoke(
        cli,
        [
            "market",
            "unregister-validator",
            "--key",
            keys["v1"],
            "--db",
            db,
            "--now",
            str(T0),
            "--json",
        ],
    )
    assert res.exit_code == 0 and json.loads(res.output)["returned"] == 100
    audit = dk("audit")
    assert audit["ok"] and audit["totals"]["held"] == 1500


def test_challenge_of_honest_result_fails_by_real_replay(
    job_and_bundles: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """``dk.verifier.replay_interval`` decides a dispute (a bool or a verdict object)."""
    from dk.pol import load_job

    job_path, honest, _ = job_and_bundles
    job = load_job(job_path)
    clock = Clock()
    m = _market(tmp_path / "m.db", clock, 1)
    clients = _clients(m, "challenger")
    oid = _to_submitted(m, clock, job, honest, clients)
    assert m.verify_result(oid, honest, job)["ok"]
    m.execute(attestation_request(m, clients["v1"], BLS["v1"], oid, honest, job))
    clock.t = T0 + 5
    m.accept(oid)
    roots = [c["root"] for c in json.loads((honest / "manifest.json").read_text())["checkpoints"]]
    counter = roots[:2] + ["ee" * 32] * (len(roots) - 2)  # a liar's transcript, diverging at 2
    clock.t = T0 + 6
    cid = m.execute(
        clients["challenger"].request("challenge", order_id=oid, bond=25, counter_roots=counter)
    )["challenge_id"]
    out = m.resolve_challenge(cid, honest, job)
    assert out["interval"] == 1 and not out["upheld"] and out["verdict"] == "accept"
    clock.t = T0 + 65
    assert m.settle(oid)["outcome"] == "released"
    assert m.balance(clients["worker"].account) == 1000 + 90 + 25
    assert m.audit(check_bls=False).ok
    m.close()


def test_demo_runs_one_job(job_and_bundles: tuple[Path, Path, Path], tmp_path: Path) -> None:
    from dk.market.demo import run_demo

    job_path, honest, _ = job_and_bundles
    lines: list[str] = []
    assert run_demo(honest, job_path, tmp_path, lines.append, worker_key=SigningKey(WORKER_SEED))
    assert any("released" in line for line in lines) and "audit clean" in lines[-1]
    assert not run_demo(honest, job_path, tmp_path / "nokey", lines.append)  # no worker key
