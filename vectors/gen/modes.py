"""Generator of ``vectors/modes/``: tolerant mode, a compressed run, ``integrity =
"challenged"``, report digests and challenge documents, one valid and one invalid case each
at least. Checked by :mod:`dk.vectors.modes`.

Bundles are the tiny digits job of ``vectors/gen/bundle.py`` (MLP 64-8-10, 20 steps, k = 5)
trained in three ways: exact (``honest/``), tolerant (``tolerant-*``, PyTorch on one thread)
and exact with top-k compression (``compressed-*``); forgeries re-commit and re-sign with the
worker key (``vectors/gen/forge.py``). The tolerant bundle is trained by PyTorch, whose
float32 kernels are not specified, so a rerun on another CPU may write other bytes; its cases
only need the replay to land within the tolerance, which holds on any machine.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dk.crypto.canonical_json import canonical_json
from dk.vectors import write_cases
from dk.vectors.modes import _check_bundle, _check_challenge, report_from_body
from vectors.gen.bundle import BEACON, WORKER, _blobs_in_name_order, _copy_real, tiny_job
from vectors.gen.forge import Forgery

ALL = 1000


def _train(job: Any, tmp: Path, out: Path) -> Path:
    from dk.pol import train_job
    from dk.prover import prove_run

    train_job(job, tmp / f"run-{out.name}")
    bundle = prove_run(tmp / f"run-{out.name}", job, WORKER, tmp / f"bundle-{out.name}")
    _copy_real(bundle, out)
    return out


def _scaled_end(src: Path, dst: Path, j: int, factor: float) -> None:
    """Move checkpoint ``j``'s weights by ``factor`` of its last update; re-commit, re-sign."""
    f = Forgery(src, dst)
    prev, t = f.tensors(j - 1), f.tensors(j)
    for k in sorted(t):
        if k.startswith("model/"):
            t[k] = (t[k] + np.float32(factor) * (t[k] - prev[k])).astype(np.float32)
    f.put(j, t)
    f.commit(WORKER)


def _residual_zeroed(src: Path, dst: Path) -> None:
    f = Forgery(src, dst)
    t = f.tensors(2)
    for k in sorted(t):
        if k.endswith("/residual"):
            t[k] = np.zeros_like(t[k])
    f.put(2, t)
    f.commit(WORKER)


def _case(comment: str, d: str, job: str, result: str, reason: str = "", **kw: Any) -> dict:
    c: dict[str, Any] = {"comment": comment, "dir": d, "job": job, "beacon": BEACON,
                         "samples": kw.pop("samples", ALL), "verify": kw.pop("verify", {}),
                         "result": result}  # fmt: skip
    if reason:
        c["expected_reason"] = reason
    c.update(kw)
    return c


def _flipped_blob(bundle: Path, j: int) -> dict[str, str]:
    """A ``write`` recipe: checkpoint ``j``'s blob with its last byte flipped (same size)."""
    m = json.loads((bundle / "manifest.json").read_text())
    rel = m["checkpoints"][j]["blob"]
    data = bytearray((bundle / rel).read_bytes())
    data[-1] ^= 0x01
    return {rel: bytes(data).hex()}


def bundle_cases(out: Path, tmp: Path) -> list[dict[str, Any]]:
    """Train the bundles into ``out`` and return the cases of ``cases.json``."""
    from dk.verifier import verify_bundle

    exact, tolerant = tiny_job(), tiny_job(mode="tolerant", tolerance=1e-3)
    compressed = tiny_job(train={"compression": "topk:0.05"})
    for name, job in (("job.toml", exact), ("job-tolerant.toml", tolerant),
                      ("job-compressed.toml", compressed)):  # fmt: skip
        (out / name).write_text(job.to_toml(), encoding="utf-8")
    honest = _train(exact, tmp, out / "honest")
    tol = _train(tolerant, tmp, out / "tolerant-honest")
    _scaled_end(tol, out / "tolerant-within", 2, 1e-5)
    _scaled_end(tol, out / "tolerant-beyond", 2, 0.05)
    comp = _train(compressed, tmp, out / "compressed-honest")
    _residual_zeroed(comp, out / "compressed-residual-zeroed")

    # integrity = "challenged": one sample, no top-q; the blobs outside the challenge are
    # neither fetched nor checked, the ones inside are.
    one = {"integrity": "challenged", "topq": 0}
    pre = verify_bundle(honest, exact, beacon=bytes.fromhex(BEACON), samples=1, topq=0,
                        replay=False, integrity="challenged")  # fmt: skip
    (i,) = pre.challenged
    needed = {i, i + 1}
    outside = max(set(range(1, 5)) - needed)
    cases = [
        _case("tolerant mode: honest bundle (PyTorch, one thread)", "tolerant-honest",
              "job-tolerant.toml", "valid"),
        _case("tolerant mode: checkpoint 2 moved by 1e-5 of its update, within tolerance 1e-3",
              "tolerant-within", "job-tolerant.toml", "valid"),
        _case("tolerant mode: checkpoint 2 moved by 5 % of its update, beyond tolerance",
              "tolerant-beyond", "job-tolerant.toml", "invalid", "REPLAY_MISMATCH"),
        _case("compressed run (topk:0.05, error feedback): honest", "compressed-honest",
              "job-compressed.toml", "valid"),
        _case("compressed run: error-feedback residual of checkpoint 2 zeroed (re-committed)",
              "compressed-residual-zeroed", "job-compressed.toml", "invalid",
              "REPLAY_MISMATCH"),
        _case(f"integrity challenged: interval {i} challenged, honest", "honest", "job.toml",
              "valid", samples=1, verify=one),
        _case(f"integrity challenged: blob of checkpoint {outside} (not challenged) corrupted:"
              " not fetched, accepted", "honest", "job.toml", "valid", samples=1, verify=one,
              write=_flipped_blob(honest, outside)),
        _case(f"integrity all: the same corrupted blob of checkpoint {outside} is caught",
              "honest", "job.toml", "invalid", "COMMITMENT_MISMATCH", samples=1,
              verify={"integrity": "all", "topq": 0}, write=_flipped_blob(honest, outside)),
        _case(f"integrity challenged: blob of checkpoint {i + 1} (challenged) corrupted",
              "honest", "job.toml", "invalid", "COMMITMENT_MISMATCH", samples=1, verify=one,
              write=_flipped_blob(honest, i + 1)),
    ]  # fmt: skip
    for n, c in enumerate(cases, 1):
        c["tcId"] = n
    return cases


def report_cases(out: Path) -> list[dict[str, Any]]:
    """Report bodies (SPEC §14.2): an accept of the honest bundle, a reject with several
    reasons and a flag; digests computed wrongly."""
    from dk.verifier import verify_bundle

    rep = verify_bundle(out / "honest", out / "job.toml", beacon=bytes.fromhex(BEACON),
                        samples=2, topq=0)  # fmt: skip
    assert rep.ok, rep.codes
    accept = rep.attestation_body()
    reject = dict(accept, verdict="reject", reasons=["COMMITMENT_MISMATCH", "REPLAY_MISMATCH"],
                  flags=["insecure-srs"], mode="zk")  # fmt: skip
    cases: list[dict[str, Any]] = []
    for comment, body in (("accept of vectors/modes/honest, beacon 00..00, s = 2", accept),
                          ("reject with two reasons and a flag", reject)):  # fmt: skip
        r = report_from_body(body)
        cases.append({"comment": comment, "result": "valid", "body": body,
                      "canonical": canonical_json(r.attestation_body()).hex(),
                      "digest": r.digest().hex()})  # fmt: skip
    from dk.crypto.hashing import TAG_REPORT, tagged_hash

    raw = canonical_json(reject)
    wrong = {
        "reasons in the order found, duplicates kept": tagged_hash(
            TAG_REPORT,
            canonical_json(
                dict(reject, reasons=["REPLAY_MISMATCH", "COMMITMENT_MISMATCH", "REPLAY_MISMATCH"])
            ),
        ),
        "body as json.dumps with default separators": tagged_hash(
            TAG_REPORT, json.dumps(reject, sort_keys=True).encode()
        ),
        "untagged SHA-256 of the canonical body": hashlib.sha256(raw).digest(),
        "figures (timings) included in the body": tagged_hash(
            TAG_REPORT, canonical_json(dict(reject, figures={"seconds": 1.5}))
        ),
    }
    for comment, digest in wrong.items():
        cases.append({"comment": comment, "result": "invalid", "expected_reason":
                      "REPORT_MISMATCH", "body": reject, "digest": digest.hex()})  # fmt: skip
    for n, c in enumerate(cases, 1):
        c["tcId"] = n
    return cases


def challenge_cases(out: Path) -> list[dict[str, Any]]:
    """Challenge documents (SPEC IV §9.3) for ``honest/`` with beacon ``00..00``, s = 2."""
    from dk.verifier import verify_bundle
    from dk.verifier.challenge import challenge_document

    pre = verify_bundle(out / "honest", out / "job.toml", beacon=bytes.fromhex(BEACON),
                        samples=2, topq=0, replay=False)  # fmt: skip
    doc = challenge_document(pre)
    other = [i for i in range(4) if i not in doc["intervals"]][:2]  # type: ignore[operator]
    docs: list[tuple[str, Any, str]] = [
        ("the challenge derived from the bundle and beacon", doc, ""),
        ("other intervals than the derivation's", dict(doc, intervals=other),
         "CHALLENGE_MISMATCH"),
        ("another transcript root", dict(doc, transcript_root="00" * 32), "CHALLENGE_MISMATCH"),
        ("intervals not sorted", dict(doc, intervals=list(reversed(doc["intervals"]))),  # type: ignore[call-overload]
         "FormatError"),
        ("an extra key", dict(doc, extra=1), "FormatError"),
        ("beacon not 32-byte hex", dict(doc, beacon="00" * 31), "FormatError"),
        ("version 2", dict(doc, version=2), "FormatError"),
    ]  # fmt: skip
    cases = []
    for n, (comment, d, reason) in enumerate(docs, 1):
        c: dict[str, Any] = {"tcId": n, "comment": comment,
                             "result": "invalid" if reason else "valid",
                             "document": canonical_json(d).hex(), "dir": "honest",
                             "job": "job.toml", "samples": 2, "topq": 0}  # fmt: skip
        if reason:
            c["expected_reason"] = reason
        cases.append(c)
    return cases


def generate(root: Path) -> None:
    """Write ``root/modes/``: bundles, cases, report digests and challenge documents."""
    out = root / "modes"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp_s, _blobs_in_name_order():
        cases = bundle_cases(out, Path(tmp_s))
    for c in cases:  # refuse to write a case the verifier does not reproduce
        msg = _check_bundle(root, c)
        assert not msg, (c["comment"], msg)
    write_cases(out / "cases.json", "modes_bundles", cases)
    reports = report_cases(out)
    write_cases(out / "report_digest.json", "report_digest", reports)
    challenges = challenge_cases(out)
    for c in challenges:
        msg = _check_challenge(root, c)
        assert not msg, (c["comment"], msg)
    write_cases(out / "challenge.json", "challenge_document", challenges)
