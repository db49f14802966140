"""Issue 10 item 2: a challenge pins the committed root.

A worker who faked its last interval sees the beacon (``dk challenge``), then re-commits: it
tweaks the faked final checkpoint, re-signs, and tries roots until the challenge derived from
the new root and the same beacon misses the faked interval. Without the pin that bundle is
accepted; with it, it is rejected as ``ROOT_NOT_CHALLENGED``, in the library and via the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from tests.helpers import WORKER
from vectors.gen.forge import FORGERIES, Forgery

from dk.cli.app import cli, main
from dk.verifier import verify_bundle
from dk.verifier.challenge import challenge_document, derive_challenge

BEACON = bytes(range(32))
S, Q = 1, 0  # one uniform sample: a grinder needs only a few tries
FAKED = 3  # the last interval


def _regrind(honest_bundle: Path, tmp: Path) -> tuple[Path, bytes]:
    """The committed (faked) bundle and a re-ground one whose challenge misses interval 3."""
    forge, _ = FORGERIES["random-final"]  # the final checkpoint is not trained: interval 3 fakes
    committed = forge(Forgery(honest_bundle, tmp / "committed"), WORKER)
    man = json.loads((committed / "manifest.json").read_text())
    root = bytes.fromhex(man["transcript_root"])
    for n in range(1, 200):  # grind: tweak the faked final checkpoint, re-commit, re-sign
        f = Forgery(committed, tmp / "reground")
        last = len(f.m["checkpoints"]) - 1
        t = f.tensors(last)
        w = next(k for k in sorted(t) if k.startswith("model/"))
        t[w].flat[0] += np.float32(n * 1e-3)
        f.put(last, t)
        f.commit(WORKER)
        new_root = bytes.fromhex(f.m["transcript_root"])
        norms = [iv["update_norm"] for iv in f.m["intervals"]]
        if FAKED not in derive_challenge(new_root, BEACON, norms, [0] * len(norms), S, Q):
            return f.dir, root
    raise AssertionError("no favourable root in 200 tries (expected ~1 in 4 to work)")


def test_reground_bundle_is_rejected(honest: tuple[object, Path], tmp_path: Path) -> None:
    job, bundle = honest
    reground, committed_root = _regrind(bundle, tmp_path)
    # the attack works when the verifier derives the challenge from whatever root it is shown
    assert verify_bundle(reground, job, beacon=BEACON, samples=S, topq=Q).ok
    pinned = verify_bundle(reground, job, beacon=BEACON, root=committed_root, samples=S, topq=Q)
    assert pinned.verdict == "reject" and pinned.codes == ["ROOT_NOT_CHALLENGED"]
    assert pinned.challenged_root == committed_root.hex()
    assert pinned.to_dict()["challenged_root"] == committed_root.hex()
    # the committed bundle itself is judged on its merits under the pin
    committed = tmp_path / "committed"
    honest_pin = verify_bundle(committed, job, beacon=BEACON, root=committed_root, samples=99)
    assert honest_pin.codes == ["REPLAY_MISMATCH"]


def test_reground_bundle_is_rejected_via_the_cli(
    honest: tuple[object, Path], tmp_path: Path
) -> None:
    job, bundle = honest
    reground, committed_root = _regrind(bundle, tmp_path)
    job_file = tmp_path / "job.toml"
    job_file.write_text(job.to_toml())  # type: ignore[attr-defined]
    run = CliRunner().invoke
    chal = tmp_path / "challenge.json"
    args = ["--beacon", BEACON.hex(), "--samples", str(S), "--topq", str(Q)]
    r = run(
        cli,
        [
            "challenge",
            str(tmp_path / "committed"),
            "--job",
            str(job_file),
            *args,
            "--out",
            str(chal),
        ],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(chal.read_text())
    assert doc["transcript_root"] == committed_root.hex() and doc["beacon"] == BEACON.hex()
    r = run(
        cli,
        [
            "verify",
            str(reground),
            "--job",
            str(job_file),
            "--challenge",
            str(chal),
            "--samples",
            str(S),
            "--topq",
            str(Q),
            "--json",
        ],
    )
    assert r.exit_code == 1, r.output
    out = json.loads(r.output)
    assert out["reasons"] == ["ROOT_NOT_CHALLENGED"]
    assert out["challenged_root"] == committed_root.hex()
    r = run(
        cli,
        [
            "verify",
            str(reground),
            "--job",
            str(job_file),
            "--root",
            committed_root.hex(),
            "--beacon",
            BEACON.hex(),
            "--json",
        ],
    )
    assert r.exit_code == 1 and json.loads(r.output)["reasons"] == ["ROOT_NOT_CHALLENGED"]
    # a challenge file that contradicts --beacon is malformed input (exit 3), not a verdict
    with pytest.raises(SystemExit) as ei:
        main(
            [
                "verify",
                str(reground),
                "--job",
                str(job_file),
                "--challenge",
                str(chal),
                "--beacon",
                "11" * 32,
            ]
        )
    assert ei.value.code == 3


def test_challenge_document_records_the_root(honest: tuple[object, Path]) -> None:
    job, bundle = honest
    rep = verify_bundle(bundle, job, beacon=BEACON, replay=False)
    doc = challenge_document(rep)
    assert doc["transcript_root"] == rep.transcript_root and doc["beacon"] == BEACON.hex()
