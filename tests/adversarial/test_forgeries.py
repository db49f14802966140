"""Every known way to fake a PoL transcript is rejected with its reason code (DESIGN §2).

Each forgery is applied to a copy of an honest bundle by a forger who holds the worker key
(``vectors/gen/forge.py``); verification replays every interval so the outcome does not
depend on the challenge draw.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import WORKER, tiny_job
from vectors.gen.forge import FORGERIES, STOLEN, Forgery, oversize_manifest

from dk.pol.transcript import MAX_MANIFEST_BYTES
from dk.verifier import verify_bundle

BEACON = bytes(32)


def _verify(bundle: Path, job: object, **kw: object) -> list[str]:
    report = verify_bundle(bundle, job, beacon=BEACON, samples=1000, **kw)
    assert not report.ok
    assert report.verdict == "reject"
    return report.codes


def test_honest_bundle_is_accepted(honest: tuple[object, Path]) -> None:
    job, bundle = honest
    report = verify_bundle(bundle, job, beacon=BEACON, samples=1000)
    assert report.ok, report.to_dict()
    assert report.challenged == list(range(4))


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forgery_is_rejected(name: str, honest: tuple[object, Path], tmp_path: Path) -> None:
    job, bundle = honest
    forge, reason = FORGERIES[name]
    forged = forge(Forgery(bundle, tmp_path / name), WORKER)
    codes = _verify(forged, job)
    assert codes[0] == reason, codes


def test_oversized_manifest(honest: tuple[object, Path], tmp_path: Path) -> None:
    job, bundle = honest
    f = Forgery(bundle, tmp_path / "big")
    oversize_manifest(f.dir, MAX_MANIFEST_BYTES + 1)
    assert _verify(f.dir, job) == ["MANIFEST_TOO_LARGE"]


def test_bundle_against_a_different_job(honest: tuple[object, Path]) -> None:
    _, bundle = honest
    other = tiny_job(seed=1)
    assert _verify(bundle, other) == ["JOB_MISMATCH"]


def test_stolen_transcript_fully_resigned(honest: tuple[object, Path], tmp_path: Path) -> None:
    """A thief who re-signs everything under his own key is caught when the job names the worker."""
    job, bundle = honest
    _, forge, reason = STOLEN
    forged = forge(Forgery(bundle, tmp_path / "stolen"), WORKER)
    assert _verify(forged, job, worker=WORKER.verify_key.hex()) == [reason]
    named = job.with_updates(pol={"worker": WORKER.verify_key.hex()})
    assert (
        verify_bundle(forged, named, beacon=BEACON).codes[0] == "JOB_MISMATCH"
    )  # job_id changed too


def test_skipped_interval_is_caught_by_sampling_only_when_sampled(
    honest: tuple[object, Path], tmp_path: Path
) -> None:
    """The skip forgery passes every integrity check: only replay exposes it, first at interval 2
    (interval 3 fails too, since checkpoint 4 was trained from the real checkpoint 3)."""
    job, bundle = honest
    forge, _ = FORGERIES["skipped-interval"]
    forged = forge(Forgery(bundle, tmp_path / "skip"), WORKER)
    report = verify_bundle(forged, job, beacon=BEACON, samples=1000)
    assert [f.interval for f in report.reasons] == [2, 3]
    assert set(report.codes) == {"REPLAY_MISMATCH"}
    assert report.checks["blobs"] == "pass" and report.checks["signature"] == "pass"


def test_missing_bundle_and_garbage_never_raise(
    tmp_path: Path, honest: tuple[object, Path]
) -> None:
    job, _ = honest
    assert verify_bundle(tmp_path / "nope", job).codes == ["BUNDLE_NOT_FOUND"]
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "manifest.json").write_bytes(b"\xff\xfe garbage")
    assert verify_bundle(tmp_path / "g", job).codes == ["MANIFEST_MALFORMED"]
    (tmp_path / "g" / "manifest.json").write_bytes(b'{"format": "dk-pol-bundle", "version": 99}')
    assert verify_bundle(tmp_path / "g", job).codes == ["UNSUPPORTED_VERSION"]
    (tmp_path / "e").mkdir()
    assert verify_bundle(tmp_path / "e", job).codes == ["MANIFEST_MISSING"]
    bad_job = tmp_path / "job.toml"
    bad_job.write_text("[model]\narch = 'transformer'\n")
    assert verify_bundle(tmp_path / "e", bad_job).codes == ["JOB_MALFORMED"]


def test_replay_interval_primitive(honest: tuple[object, Path], tmp_path: Path) -> None:
    """The market's dispute primitive: honest intervals replay, the forged one does not."""
    from dk.verifier import replay_interval

    job, bundle = honest
    assert all(replay_interval(bundle, job, i).verdict == "accept" for i in range(4))
    forge, _ = FORGERIES["skipped-interval"]
    forged = forge(Forgery(bundle, tmp_path / "skip"), WORKER)
    got = [replay_interval(forged, job, i) for i in range(4)]
    assert [r.verdict for r in got] == ["accept", "accept", "reject", "reject"]
    assert got[2].reason == "REPLAY_MISMATCH" and not got[2]
    assert replay_interval(forged, job, 99).verdict == "reject"
    nowhere = replay_interval(tmp_path / "nowhere", job, 0)  # the verifier's own path is wrong
    assert nowhere.verdict == "inconclusive" and nowhere.reason == "BUNDLE_NOT_FOUND"


def test_challenged_integrity_checks_only_what_it_replays(
    honest: tuple[object, Path], tmp_path: Path
) -> None:
    """integrity='challenged' fetches only challenged checkpoints: a tampered blob outside the
    challenge goes unnoticed there (the default) but not with integrity='all'."""
    job, bundle = honest
    f = Forgery(bundle, tmp_path / "t")
    blob = f.dir / f.m["checkpoints"][4]["blob"]  # the final checkpoint
    data = bytearray(blob.read_bytes())
    data[-3] ^= 1
    blob.write_bytes(bytes(data))
    # interval 0 alone needs checkpoints 0 and 1
    lazy = verify_bundle(f.dir, job, beacon=BEACON, samples=0, topq=0, integrity="challenged")
    assert lazy.figures["checkpoints_checked"] <= 2 and lazy.challenged == []
    assert verify_bundle(f.dir, job, beacon=BEACON, samples=0, topq=0).ok  # the default
    full = verify_bundle(f.dir, job, beacon=BEACON, samples=0, topq=0, integrity="all")
    assert full.codes == ["COMMITMENT_MISMATCH"]
    touched = verify_bundle(f.dir, job, beacon=BEACON, samples=1000, integrity="challenged")
    assert touched.codes == ["COMMITMENT_MISMATCH"]
