"""zk mode end to end (issue 4): train on the circuit, commit, challenge, prove, verify.

A tiny regression job (linear 4→2, MSE, batch 2, 4 steps, k = 2) keeps every proof near one
second; the circuits, keys and local SRS are cached once per module.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tests.helpers import WORKER

from dk.verifier import verify_bundle
from dk.verifier.challenge import challenge_document

pytestmark = [pytest.mark.ezkl, pytest.mark.slow]

BEACON = bytes(range(32))
TINY_ZK = {"decomp_base": 256, "decomp_legs": 4, "srs": "local"}


@pytest.fixture(scope="module")
def zk(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    pytest.importorskip("ezkl")
    import os

    from dk.circuits.session import zk_init_extra
    from dk.pol import default_job
    from dk.prover import prove_run, train
    from dk.prover.zk import respond_zk

    tmp = tmp_path_factory.mktemp("zkflow")
    os.environ["DK_CACHE_DIR"] = str(tmp / "cache")
    rng = np.random.default_rng(3)
    X = rng.normal(size=(16, 4)).astype(np.float32)
    y = (X @ rng.normal(size=(4, 2)) * 0.5).astype(np.float32)
    np.savez(tmp / "data.npz", X=X, y=y)
    job = default_job(
        arch="linear",
        mode="zk",
        dataset="npz",
        data_path="data.npz",
        steps=4,
        interval=2,
        batch_size=2,
        loss="mse",
        lr=0.1,
        base_dir=tmp,
        pol={"zk": TINY_ZK},
        init_extra=zk_init_extra,
    )
    assert job.pol["init_root"]
    train(job, tmp / "run")
    committed = prove_run(tmp / "run", job, WORKER, tmp / "committed")
    pre = verify_bundle(committed, job, beacon=BEACON, samples=2, topq=0, replay=False)
    assert pre.ok, pre.codes
    doc = challenge_document(pre)
    assert doc["intervals"] == [0, 1]
    (tmp / "challenge.json").write_text(json.dumps(doc))
    bundle = respond_zk(tmp / "run", job, WORKER, tmp / "bundle", challenge=tmp / "challenge.json")
    return {"job": job, "bundle": bundle, "committed": committed, "tmp": tmp}


def _copy(zk: dict[str, object], name: str) -> Path:
    dst = Path(zk["tmp"]) / name  # type: ignore[arg-type]
    shutil.copytree(zk["bundle"], dst)  # type: ignore[arg-type]
    return dst


def _records(b: Path, i: int) -> list[dict]:
    return json.loads((b / f"proofs/interval-{i}.json").read_text())


def _write(b: Path, i: int, records: list[dict]) -> None:
    p = b / f"proofs/interval-{i}.json"
    p.unlink()
    p.write_text(json.dumps(records))


def test_honest_proofs_are_accepted_without_replay(zk: dict[str, object]) -> None:
    report = verify_bundle(zk["bundle"], zk["job"], beacon=BEACON, samples=2, topq=0)
    assert report.ok, report.to_dict()
    assert report.checks["zk"] == "pass" and "replay" not in report.checks
    assert report.flags == ["insecure-srs"]
    assert report.figures["proven_steps_checked"] == 4
    # the report shows which SRS checked the proofs, and its digest covers it (SPEC IV §5)
    assert report.srs["kind"] == "local" and len(report.srs["sha256"]) == 64
    assert report.attestation_body()["srs"] == report.srs


def test_committed_bundle_without_proofs_is_missing_them(zk: dict[str, object]) -> None:
    report = verify_bundle(zk["committed"], zk["job"], beacon=BEACON, samples=2, topq=0)
    assert set(report.codes) == {"ZK_PROOF_MISSING"}


def test_proof_of_a_different_step(zk: dict[str, object]) -> None:
    b = _copy(zk, "swapped")
    a0, a1 = _records(b, 0), _records(b, 1)
    _write(b, 0, a1)
    _write(b, 1, a0)
    report = verify_bundle(b, zk["job"], beacon=BEACON, samples=2, topq=0)
    assert report.codes[0] == "ZK_STEP_MISMATCH", report.codes


def test_tampered_proof(zk: dict[str, object]) -> None:
    b = _copy(zk, "tampered-proof")
    recs = _records(b, 1)
    proof = bytearray(bytes.fromhex(recs[0]["proof"]))
    proof[100] ^= 1
    recs[0]["proof"] = proof.hex()
    _write(b, 1, recs)
    assert verify_bundle(b, zk["job"], beacon=BEACON, samples=2, topq=0).codes == [
        "ZK_PROOF_INVALID"
    ]


def test_tampered_public_instances(zk: dict[str, object]) -> None:
    b = _copy(zk, "tampered-instances")
    recs = _records(b, 0)
    inst = recs[1]["instances"]
    inst[-1] = inst[-2] if inst[-1] != inst[-2] else inst[0]
    _write(b, 0, recs)
    codes = verify_bundle(b, zk["job"], beacon=BEACON, samples=2, topq=0).codes
    assert codes == ["ZK_INSTANCE_MISMATCH"], codes


def test_proof_for_another_circuit(zk: dict[str, object]) -> None:
    b = _copy(zk, "other-circuit")
    recs = _records(b, 0)
    recs[0]["circuit_id"] = "00" * 32
    _write(b, 0, recs)
    codes = verify_bundle(b, zk["job"], beacon=BEACON, samples=2, topq=0).codes
    assert codes == ["ZK_CIRCUIT_MISMATCH"], codes


def test_proof_path_tricks_are_refused(zk: dict[str, object]) -> None:
    from dk.pol.transcript import Manifest

    b = _copy(zk, "proof-path")
    m = json.loads((b / "manifest.json").read_text())
    m["proofs"][0]["file"] = "../../etc/passwd"
    (b / "manifest.json").unlink()
    (b / "manifest.json").write_bytes(Manifest(m).to_bytes())
    assert "BAD_PATH" in verify_bundle(b, zk["job"], beacon=BEACON, samples=2, topq=0).codes


def test_cli_challenge_respond_verify(zk: dict[str, object]) -> None:
    from click.testing import CliRunner

    from dk.cli.app import cli

    tmp = Path(zk["tmp"])  # type: ignore[arg-type]
    (tmp / "job.toml").write_text(zk["job"].to_toml())  # type: ignore[attr-defined]
    if not (tmp / "w.key").exists():
        WORKER.save(tmp / "w.key")
    runner = CliRunner()
    beacon = ["--beacon", BEACON.hex(), "--samples", "1", "--topq", "0"]

    def dk(*args: str) -> object:
        return runner.invoke(cli, list(args), catch_exceptions=False)

    r = dk(
        "challenge",
        str(tmp / "committed"),
        "--job",
        str(tmp / "job.toml"),
        *beacon,
        "--out",
        str(tmp / "ch1.json"),
        "--json",
    )
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.output)["intervals"]) == 1
    r = dk(
        "prove",
        str(tmp / "run"),
        "--job",
        str(tmp / "job.toml"),
        "--key",
        str(tmp / "w.key"),
        "--respond",
        str(tmp / "ch1.json"),
        "--zk",
        "--out",
        str(tmp / "cli-bundle"),
    )
    assert r.exit_code == 0, r.output
    r = dk(
        "verify", str(tmp / "cli-bundle"), "--job", str(tmp / "job.toml"),
        "--challenge", str(tmp / "ch1.json"), "--samples", "1", "--topq", "0", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["flags"] == ["insecure-srs"]
    assert json.loads(r.output)["srs"]["kind"] == "local"
    other = ["--beacon", "ff" * 32, "--samples", "1", "--topq", "0"]
    r = dk("verify", str(tmp / "cli-bundle"), "--job", str(tmp / "job.toml"), *other, "--json")
    challenged = json.loads(r.output)["challenged"]
    proven = json.loads((tmp / "ch1.json").read_text())["intervals"]
    assert r.exit_code == (0 if challenged == proven else 1)


# -- issue 10 item 6: the job names the SRS it accepts ----------------------------------------


def _rebind(zk: dict[str, object], name: str, srs: str) -> tuple[object, Path]:
    """The honest answer, re-signed for the same job naming another accepted SRS."""
    from vectors.gen.forge import Forgery

    job = zk["job"].with_updates(pol={"zk": {**TINY_ZK, "srs": srs}})  # type: ignore[attr-defined]
    f = Forgery(Path(zk["bundle"]), Path(zk["tmp"]) / name)  # type: ignore[arg-type]
    f.m["job_id"] = job.job_id.hex()
    return job, f.commit(WORKER)


def _local_srs_sha256(zk: dict[str, object]) -> str:
    rec = _records(Path(zk["bundle"]), 0)[0]  # type: ignore[arg-type]
    return str(rec["srs_sha256"])


def test_job_naming_the_local_srs_by_digest_accepts(zk: dict[str, object]) -> None:
    job, b = _rebind(zk, "pinned-local", _local_srs_sha256(zk))
    r = verify_bundle(b, job, beacon=BEACON, samples=2, topq=0)
    assert r.ok, r.codes
    assert r.srs == {"sha256": _local_srs_sha256(zk), "kind": "local"}
    assert r.flags == ["insecure-srs"]  # still true to its origin


def test_a_local_srs_is_not_accepted_for_a_job_naming_another(zk: dict[str, object]) -> None:
    """A verifier holding only a local SRS cannot check proofs for a job that names another
    SRS: inconclusive (it lacks the job's SRS), never an acceptance, never the worker's fault."""
    job, b = _rebind(zk, "pinned-other", "ab" * 32)
    r = verify_bundle(b, job, beacon=BEACON, samples=2, topq=0)
    assert r.verdict == "inconclusive" and r.codes == ["ZK_SRS_UNAVAILABLE"], r.codes


def test_a_flag_alone_does_not_make_a_local_srs_trusted(
    zk: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: DK_ZK_SRS_KIND=ceremony made any supplied file a trusted SRS. Now the label is
    only a label: the job's pin decides."""
    from dk.circuits.srs import file_sha256

    local = next((Path(zk["tmp"]) / "cache" / "srs").glob("local-k*.srs"))  # type: ignore[arg-type]
    monkeypatch.setenv("DK_ZK_SRS", str(local))
    monkeypatch.setenv("DK_ZK_SRS_SHA256", file_sha256(local))
    monkeypatch.setenv("DK_ZK_SRS_KIND", "ceremony")
    job, b = _rebind(zk, "flag-only", "cd" * 32)
    r = verify_bundle(b, job, beacon=BEACON, samples=2, topq=0)
    assert r.verdict == "inconclusive" and r.codes == ["ZK_SRS_UNAVAILABLE"], r.codes
    monkeypatch.delenv("DK_ZK_SRS_KIND")  # a supplied file is "local" unless said otherwise
    r = verify_bundle(zk["bundle"], zk["job"], beacon=BEACON, samples=2, topq=0)
    assert r.ok and r.srs["kind"] == "local" and r.flags == ["insecure-srs"]


def test_proofs_under_another_srs_than_the_pinned_one_reject(zk: dict[str, object]) -> None:
    """The job pins the verifier's SRS; the worker proved under another: the worker's fault."""
    job, b = _rebind(zk, "worker-other-srs", _local_srs_sha256(zk))
    for i in (0, 1):
        recs = _records(b, i)
        for rec in recs:
            rec["srs_sha256"] = "ef" * 32
        _write(b, i, recs)
    r = verify_bundle(b, job, beacon=BEACON, samples=2, topq=0)
    assert r.verdict == "reject" and r.codes[0] == "ZK_SRS_MISMATCH", r.codes
    # under a job that accepts any local SRS the verifier merely lacks the worker's file
    r = verify_bundle(_retag(zk, b), zk["job"], beacon=BEACON, samples=2, topq=0)
    assert r.verdict == "inconclusive" and r.codes[0] == "ZK_SRS_UNAVAILABLE", r.codes


def _retag(zk: dict[str, object], b: Path) -> Path:
    from vectors.gen.forge import Forgery

    f = Forgery(b, b.with_name(b.name + "-local"))
    f.m["job_id"] = zk["job"].job_id.hex()  # type: ignore[attr-defined]
    return f.commit(WORKER)


def test_job_srs_field_is_checked() -> None:
    from dk.errors import FormatError
    from dk.pol import default_job

    for bad in ("ceremony", "AB" * 32, "ab" * 31, 7):
        with pytest.raises(FormatError, match=r"pol\.zk\.srs"):
            default_job(arch="linear", mode="zk", pol={"zk": {"srs": bad}})
