"""verify_bundle end to end on one honest tiny bundle: accept, its report, options, refusals
not covered by tests/adversarial, the dispute primitive, and parallel replay."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import WORKER, make_bundle
from vectors.gen.forge import FORGERIES, Forgery

from dk.crypto.keys import SigningKey
from dk.errors import VerificationFailed
from dk.pol.data import Dataset, load_dataset
from dk.verifier import replay_interval, verify_bundle
from dk.verifier.challenge import derive_challenge, detection_probability, samples_for

BEACON = bytes(range(32))


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    return make_bundle(tmp_path_factory.mktemp("honest"))


@pytest.fixture(scope="module")
def skipped(honest: tuple[Any, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    forge, _ = FORGERIES["skipped-interval"]
    return forge(Forgery(honest[1], tmp_path_factory.mktemp("skip") / "b"), WORKER)


def test_accept_and_report_contents(honest: tuple[Any, Path]) -> None:
    job, bundle = honest
    r = verify_bundle(bundle, job, beacon=BEACON)
    assert r.ok and r.check() is r, r.to_dict()
    assert r.job_id == job.job_id.hex() and r.worker_key == WORKER.verify_key.hex()
    assert r.beacon == BEACON.hex() and r.mode == "exact"
    assert all(v == "pass" for v in r.checks.values())
    assert {"manifest", "signature", "job", "data", "init", "batches", "blobs", "replay"} <= set(
        r.checks
    )
    m = job.num_intervals
    s = samples_for(m, 0.1, 0.99)
    f = r.figures
    assert f["intervals"] == m and f["samples"] == s and f["beacon_source"] == "given"
    assert f["detection_probability"] == round(detection_probability(m, s, 0.1), 6)
    assert f["replayed_intervals"] == len(r.challenged) and f["bytes_read"] > 0
    # the challenge is re-derivable by anyone from the transcript root and the beacon
    man = json.loads((bundle / "manifest.json").read_text())
    norms = [iv["update_norm"] for iv in man["intervals"]]
    epochs = [iv["start_step"] // (1797 // 16) for iv in man["intervals"]]
    assert r.challenged == derive_challenge(
        bytes.fromhex(r.transcript_root), BEACON, norms, epochs, s, 1
    )


def test_verdict_and_digest_are_deterministic(honest: tuple[Any, Path]) -> None:
    job, bundle = honest
    a = verify_bundle(bundle, job, beacon=BEACON, samples=1, topq=0)
    b = verify_bundle(bundle, job, beacon=BEACON, samples=1, topq=0)
    assert a.digest() == b.digest() and len(a.challenged) == 1
    c = verify_bundle(bundle, job, beacon=bytes(32), samples=1, topq=0)
    assert c.digest() != a.digest()


def test_no_beacon_draws_a_fresh_nonce(honest: tuple[Any, Path]) -> None:
    job, bundle = honest
    a = verify_bundle(bundle, job, samples=0, topq=0)
    b = verify_bundle(bundle, job, samples=0, topq=0)
    assert a.ok and b.ok and a.beacon != b.beacon and len(bytes.fromhex(a.beacon)) == 32
    assert a.figures["beacon_source"] == "verifier-nonce" and a.challenged == []


def test_job_given_as_a_path(honest: tuple[Any, Path], tmp_path: Path) -> None:
    job, bundle = honest
    p = tmp_path / "job.toml"
    p.write_text(job.to_toml())
    assert verify_bundle(bundle, p, beacon=BEACON, samples=1).ok
    assert verify_bundle(bundle, str(p), beacon=BEACON, samples=1).ok


def test_required_worker(honest: tuple[Any, Path]) -> None:
    job, bundle = honest
    assert verify_bundle(bundle, job, beacon=BEACON, samples=0, worker=WORKER.verify_key.hex()).ok
    other = SigningKey(bytes(32)).verify_key.hex()
    assert verify_bundle(bundle, job, beacon=BEACON, worker=other).codes == ["WORKER_MISMATCH"]


def test_verifier_data_must_match(honest: tuple[Any, Path]) -> None:
    job, bundle = honest
    ds = load_dataset(job)
    other = Dataset(ds.X[:-1], ds.y[:-1])
    r = verify_bundle(bundle, job, beacon=BEACON, dataset=other)
    assert r.codes == ["DATA_UNAVAILABLE"] and r.verdict == "inconclusive"  # the verifier's fault
    with pytest.raises(VerificationFailed) as ei:
        r.check()
    assert ei.value.reason.value == "DATA_UNAVAILABLE"


@pytest.mark.parametrize(
    "content, code",
    [
        (None, "SIGNATURE_MISSING"),
        (b"not hex\n", "SIGNATURE_INVALID"),
        (b"\xff\xfe", "SIGNATURE_INVALID"),
        (b"00" * 200, "SIGNATURE_INVALID"),
        (b"", "SIGNATURE_INVALID"),
    ],
)
def test_signature_file_problems(
    content: bytes | None, code: str, honest: tuple[Any, Path], tmp_path: Path
) -> None:
    job, bundle = honest
    b = tmp_path / "b"
    shutil.copytree(bundle, b)
    if content is None:
        (b / "signature.hex").unlink()
    else:
        (b / "signature.hex").write_bytes(content)
    assert verify_bundle(b, job, beacon=BEACON).codes == [code]


def test_bundle_path_is_a_file(honest: tuple[Any, Path]) -> None:
    job, bundle = honest
    assert verify_bundle(bundle / "manifest.json", job).codes == ["BUNDLE_NOT_FOUND"]


def test_dispute_replay_interval(honest: tuple[Any, Path], skipped: Path) -> None:
    job, bundle = honest
    assert all(replay_interval(bundle, job, i).ok for i in range(job.num_intervals))
    assert replay_interval(bundle, job, job.num_intervals).verdict == "reject"
    assert replay_interval(bundle, job, -1).verdict == "reject"
    got = [replay_interval(skipped, job, i).verdict for i in range(job.num_intervals)]
    assert got == ["accept", "accept", "reject", "reject"]


@pytest.mark.slow
def test_two_workers_give_the_same_verdict(honest: tuple[Any, Path], skipped: Path) -> None:
    """One pool run (spawn start-up is the cost): intervals 0-1 replay, 2-3 do not."""
    job, _ = honest
    one = verify_bundle(skipped, job, beacon=BEACON, samples=100, workers=1)
    two = verify_bundle(skipped, job, beacon=BEACON, samples=100, workers=2)
    assert one.verdict == two.verdict == "reject"
    assert one.codes == two.codes == ["REPLAY_MISMATCH", "REPLAY_MISMATCH"]
    assert [f.interval for f in one.reasons] == [f.interval for f in two.reasons] == [2, 3]
    assert one.digest() == two.digest()
    assert two.figures["replayed_intervals"] == 4


@pytest.mark.parametrize(
    "update, match",
    [({"model": {"output_dim": 5}}, "5 outputs"), ({"train": {"batch_size": 5000}}, "exceeds")],
)
def test_a_job_that_does_not_fit_its_data(
    update: dict, match: str, honest: tuple[Any, Path], tmp_path: Path
) -> None:
    """A (forged) bundle for a job whose model or batch size does not fit the job's own data
    is refused as a malformed job, not an internal error."""
    job, bundle = honest
    bad = job.with_updates(**update)
    f = Forgery(bundle, tmp_path / "b")
    f.m["job_id"] = bad.job_id.hex()
    r = verify_bundle(f.commit(WORKER), bad, beacon=BEACON)
    assert r.codes == ["JOB_MALFORMED"] and match in r.reasons[0].message


def test_challenged_integrity_checks_the_challenged_batch_commitments(
    honest: tuple[Any, Path], tmp_path: Path
) -> None:
    """SPEC §12.2: ``challenged`` recomputes the batch commitments of the challenged intervals
    only (a replay never reads them); ``all`` recomputes every one."""
    job, bundle = honest
    f = Forgery(bundle, tmp_path / "b")
    f.m["intervals"][1]["batch_commitment"] = f.m["intervals"][2]["batch_commitment"]
    forged = f.commit(WORKER)
    lazy = verify_bundle(forged, job, beacon=BEACON, samples=0, topq=0)
    assert lazy.ok and lazy.figures["batches_checked"] == 0, lazy.to_dict()
    full = verify_bundle(forged, job, beacon=BEACON, samples=0, topq=0, integrity="all")
    assert full.codes == ["BATCH_MISMATCH"] and full.figures["batches_checked"] == 4
    touched = verify_bundle(forged, job, beacon=BEACON, samples=1000)
    assert touched.codes == ["BATCH_MISMATCH"] and touched.figures["batches_checked"] == 4
    assert touched.reasons[0].interval == 1 and touched.challenged == []  # SPEC §12.2 step 11
