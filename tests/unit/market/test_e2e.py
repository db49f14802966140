"""End to end with the real verifier, real bundles and real BLS (py_ecc): honest and forged jobs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from market_support import T0, key

from dk.cli.app import cli
from dk.crypto.keys import SigningKey
from dk.errors import FormatError
from dk.market import BlsKey, Client, Market, MarketConfig, MarketRefused, bundle_commitment
from dk.market.validator import attestation_request, registration_request

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


def _to_verified(m: Market, job: object, bundle: Path, clients: dict[str, Client]) -> str:
    for name in clients:
        m.execute(clients[name].request("deposit", amount=1000), now=T0)
    oid = m.execute(clients["consumer"].request(
        "order", job_id=job.job_id.hex(), max_price=100, min_stake=40, deadline=T0 + 1000,
        tags={"region": "eu"}), now=T0)["order_id"]
    m.execute(clients["worker"].request("bid", price=90, capacity=1, stake=40,
                                        tags={"region": "eu"}), now=T0)
    m.execute(clients["consumer"].request("match", order_id=oid), now=T0)
    m.execute(clients["worker"].request("submit", order_id=oid, **bundle_commitment(bundle)),
              now=T0 + 1)
    return oid


def test_full_honest_job_end_to_end(job_and_bundles: tuple[Path, Path, Path],
                                    tmp_path: Path) -> None:
    from dk.pol import load_job

    job_path, honest, _ = job_and_bundles
    job = load_job(job_path)
    m = Market.create(tmp_path / "m.db", now=T0, config=MarketConfig(k=2, window=60))
    ids = {"consumer": key(1), "worker": SigningKey(WORKER_SEED), "v1": key(3), "v2": key(4),
           "v3": key(5)}
    clients = {n: Client(k, m.market_id) for n, k in ids.items()}
    oid = _to_verified(m, job, honest, clients)
    out = m.verify_result(oid, honest, job, now=T0 + 2)
    assert out["ok"] and out["beacon"] == m.order(oid)["beacon"]
    bls_keys = {n: BlsKey.from_seed(bytes([i]) * 32) for i, n in enumerate(["v1", "v2", "v3"])}
    for n in ("v1", "v2"):
        m.execute(registration_request(clients[n], bls_keys[n]), now=T0 + 3)
        m.execute(attestation_request(m, clients[n], bls_keys[n], oid, honest, job), now=T0 + 4)
    with pytest.raises(MarketRefused) as e:  # v3 is not registered: its attestation is refused
        m.execute(attestation_request(m, clients["v3"], bls_keys["v3"], oid, honest, job),
                  now=T0 + 4)
    assert e.value.reason == "NOT_VALIDATOR"
    accepted = m.accept(oid, now=T0 + 5)
    assert sorted(accepted["signers"]) == sorted([clients["v1"].account, clients["v2"].account])
    with pytest.raises(MarketRefused):
        m.settle(oid, now=T0 + 64)
    assert m.settle(oid, now=T0 + 65)["outcome"] == "released"
    assert m.balance(clients["worker"].account) == 1000 + 90
    assert m.balance(clients["consumer"].account) == 1000 - 90
    report = m.audit()  # re-checks the PoPs and the aggregate with real pairings
    assert report.ok, report.problems
    m.close()


def test_forged_bundle_is_never_paid(job_and_bundles: tuple[Path, Path, Path],
                                     tmp_path: Path) -> None:
    from dk.pol import load_job

    job_path, _, forged = job_and_bundles
    job = load_job(job_path)
    m = Market.create(tmp_path / "m.db", now=T0, config=MarketConfig(k=1, window=60))
    clients = {"consumer": Client(key(1), m.market_id),
               "worker": Client(SigningKey(WORKER_SEED), m.market_id),
               "v1": Client(key(3), m.market_id)}
    oid = _to_verified(m, job, forged, clients)
    with pytest.raises(FormatError):  # no bundle at all: nothing is recorded
        m.verify_result(oid, tmp_path / "missing", job, now=T0 + 2)
    out = m.verify_result(oid, forged, job, now=T0 + 2)
    assert not out["ok"] and out["outcome"] == "rejected" and out["reasons"]
    bls = BlsKey.from_seed(bytes([7]) * 32)
    m.execute(registration_request(clients["v1"], bls), now=T0 + 3)
    with pytest.raises(MarketRefused) as e:
        attestation_request(m, clients["v1"], bls, oid, forged, job)
    assert e.value.reason == "BAD_STATE"
    with pytest.raises(MarketRefused) as e:
        m.accept(oid, now=T0 + 4)
    assert e.value.reason == "BAD_STATE"
    with pytest.raises(MarketRefused) as e:
        m.settle(oid, now=T0 + 5000)
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
        res = runner.invoke(cli, ["market", *args, "--db", db, "--json", "--now", str(T0)],
                            catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return json.loads(res.output)

    assert len(dk("init", "--k", "1", "--window", "0")["market_id"]) == 64
    for name in keys:
        dk("deposit", "--key", keys[name], "500")
    oid = dk("order", "--key", keys["consumer"], "--job", str(job_path), "--max-price", "100",
             "--deadline", "100", "--tag", "region=eu")["order_id"]
    dk("bid", "--key", keys["worker"], "--price", "60", "--tag", "region=us")
    res = runner.invoke(cli, ["market", "match", "--key", keys["consumer"], oid, "--db", db,
                              "--now", str(T0)])
    assert res.exit_code == 1 and "NO_MATCH" in res.output
    shown = dk("show", oid)
    assert shown["bids"][0]["reasons"] == ["TAG_MISMATCH region (us != eu)"]
    dk("bid", "--key", keys["worker"], "--price", "70", "--tag", "region=eu")
    assert dk("match", "--key", keys["consumer"], oid)["price"] == 70
    dk("submit", "--key", keys["worker"], oid, str(honest))
    assert dk("verify", oid, str(honest), "--job", str(job_path))["ok"]
    BlsKey.from_seed(bytes([9]) * 32).save(tmp_path / "v1.bls")
    dk("register-validator", "--key", keys["v1"], "--bls-key", str(tmp_path / "v1.bls"))
    dk("attest", "--key", keys["v1"], "--bls-key", str(tmp_path / "v1.bls"), "--job",
       str(job_path), oid, str(honest))
    dk("accept", oid)
    assert dk("settle", oid)["outcome"] == "released"
    audit = dk("audit")
    assert audit["ok"] and audit["totals"]["held"] == 1500


def test_challenge_of_honest_result_fails_by_real_replay(
    job_and_bundles: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """Needs ``dk.verifier.replay_interval(bundle_dir, job, index) -> bool`` (the foundation)."""
    from dk.pol import load_job

    job_path, honest, _ = job_and_bundles
    job = load_job(job_path)
    m = Market.create(tmp_path / "m.db", now=T0, config=MarketConfig(k=1, window=60))
    clients = {"consumer": Client(key(1), m.market_id),
               "worker": Client(SigningKey(WORKER_SEED), m.market_id),
               "v1": Client(key(3), m.market_id), "challenger": Client(key(6), m.market_id)}
    oid = _to_verified(m, job, honest, clients)
    assert m.verify_result(oid, honest, job, now=T0 + 2)["ok"]
    bls = BlsKey.from_seed(bytes([7]) * 32)
    m.execute(registration_request(clients["v1"], bls), now=T0 + 3)
    m.execute(attestation_request(m, clients["v1"], bls, oid, honest, job), now=T0 + 4)
    m.accept(oid, now=T0 + 5)
    roots = [c["root"] for c in json.loads((honest / "manifest.json").read_text())["checkpoints"]]
    counter = roots[:2] + ["ee" * 32] * (len(roots) - 2)  # a liar's transcript, diverging at 2
    cid = m.execute(clients["challenger"].request(
        "challenge", order_id=oid, bond=25, counter_roots=counter), now=T0 + 6)["challenge_id"]
    out = m.resolve_challenge(cid, honest, job, now=T0 + 7)
    assert out["interval"] == 1 and not out["upheld"]
    assert m.settle(oid, now=T0 + 65)["outcome"] == "released"
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
