"""Generator of ``vectors/modes/``: tolerant mode, a compressed run, ``integrity =
"challenged"``, report digests and challenge documents, one valid and one invalid case each
at least. Checked by :mod:`dk.vectors.modes`.

Bundles are the tiny digits job of ``vectors/gen/bundle.py`` (MLP 64-8-10, 20 steps, k = 5)
trained in three ways: exact (``honest/``), tolerant (``tolerant-*``, PyTorch on one thread)
and exact with top-k compression (``compressed-*``); forgeries re-commit and re-sign with the
worker key (``vectors/gen/forge.py``). The tolerant bundle is trained by PyTorch, whose
float32 kernels are not specified, so a rerun on another CPU may write other bytes; its cases
only need the replay to land within the tolerance, which holds on any machine. The compressed
run has two data-parallel ranks (SPEC §8.5), so it trains on dk's kernels and its bytes are the
same on every CPU: a one-rank compressed job trains on PyTorch (``pol.backend = "torch"``,
same machine only), whose bundle another CPU replays to other bits (an AVX-512 CPU gave
``REPLAY_MISMATCH`` on the one-rank bundle an AVX2 CPU wrote).
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
from dk.crypto.keys import SigningKey
from dk.vectors import write_cases
from dk.vectors.modes import _check_bundle, _check_challenge, report_from_body
from vectors.gen.bundle import BEACON, WORKER, _blobs_in_name_order, _copy_real, tiny_job
from vectors.gen.forge import Forgery

ALL = 1000


# The compressed run's ranks: rank 0 is the worker who submits (SPEC §8.5).
RANK_KEYS = [WORKER, SigningKey(bytes([0xC1]) * 32)]


def _train(job: Any, tmp: Path, out: Path) -> Path:
    from dk.dist.local import train_threads
    from dk.pol import train_job
    from dk.prover import prove_run

    if job.train.get("world_size", 1) > 1:
        train_threads(job, tmp / f"run-{out.name}", RANK_KEYS)
    else:
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
    """Every rank's error-feedback residual in checkpoint 2 zeroed; re-committed, and signed
    again by the worker and by each rank (a forger holding every rank's key)."""
    _ranks_forged(src, dst, "/residual", 0.0)


def _ranks_forged(src: Path, dst: Path, suffix: str, value: float) -> None:
    """Every float32 tensor of checkpoint 2 whose name ends in ``suffix`` set to ``value``;
    re-committed, and signed again by the worker and by each rank."""
    from dk.pol.rank_ext import rank_signing_digest

    f = Forgery(src, dst)
    t = f.tensors(2)
    changed = [k for k in sorted(t) if k.endswith(suffix) and t[k].dtype == np.float32]
    assert len(changed) >= len(RANK_KEYS), changed
    for k in changed:
        t[k] = np.full_like(t[k], np.float32(value))
    f.put(2, t)
    f.commit(WORKER)
    jid, root = bytes.fromhex(f.m["job_id"]), bytes.fromhex(f.m["transcript_root"])
    f.m["rank_signatures"] = [
        k.sign(rank_signing_digest(jid, root, r, k.verify_key.raw)).hex()
        for r, k in enumerate(RANK_KEYS)
    ]
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
    compressed = tiny_job(train={"compression": "topk:0.05", "world_size": 2})  # dk's kernels
    for name, job in (("job.toml", exact), ("job-tolerant.toml", tolerant),
                      ("job-compressed.toml", compressed)):  # fmt: skip
        (out / name).write_text(job.to_toml(), encoding="utf-8")
    honest = _train(exact, tmp, out / "honest")
    tol = _train(tolerant, tmp, out / "tolerant-honest")
    _scaled_end(tol, out / "tolerant-within", 2, 1e-5)
    _scaled_end(tol, out / "tolerant-beyond", 2, 0.05)
    comp = _train(compressed, tmp, out / "compressed-honest")
    _residual_zeroed(comp, out / "compressed-residual-zeroed")
    # finite, but the replayed gradients overflow: the codec refuses them (SPEC III §5), which
    # is the worker's REPLAY_MISMATCH (SPEC §12.3), not the verifier's internal error
    _ranks_forged(comp, out / "compressed-diverging-state", "/residual", 3e38)

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
        _case("compressed run (topk:0.05, error feedback, 2 data-parallel ranks on dk's "
              "kernels): honest", "compressed-honest", "job-compressed.toml", "valid"),
        _case("compressed run: both ranks' error-feedback residuals of checkpoint 2 zeroed "
              "(re-committed)",
              "compressed-residual-zeroed", "job-compressed.toml", "invalid",
              "REPLAY_MISMATCH"),
        _case("compressed run: both ranks' residuals of checkpoint 2 at 3e38, the replayed "
              "gradients overflow (re-committed; worker-side, not an internal error)",
              "compressed-diverging-state", "job-compressed.toml", "invalid",
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


TINY_ZK = {"decomp_base": 256, "decomp_legs": 4}
SRS = "circuits/srs-local-k10.srs"  # relative to vectors/; the SRS the circuit vectors use
ZK_KEEP = ("zk-committed", "zk-honest", "zk-tampered-proof", "job-zk.toml", "zk-data.npz")


def zk_env(root: Path, cache: Path) -> dict[str, str]:
    """Environment of a worker or verifier using the checked-in local SRS (SPEC IV §9.6)."""
    srs = root / SRS
    return {"DK_CACHE_DIR": str(cache), "DK_ZK_SRS": str(srs), "DK_ZK_SRS_KIND": "local",
            "DK_ZK_SRS_SHA256": hashlib.sha256(srs.read_bytes()).hexdigest()}  # fmt: skip


def zk_bundles(root: Path, out: Path, tmp: Path) -> None:
    """Train a tiny zk job (linear 4->2, MSE, batch 2, 4 steps, k = 2), commit, challenge
    both intervals (beacon 00..00), prove them; write the committed bundle, the answered one
    and one with a proof byte flipped. Slow (EZKL) and random (Halo2 proofs)."""
    import os

    from dk.circuits.session import zk_init_extra
    from dk.pol import default_job
    from dk.prover import prove_run, train
    from dk.prover.zk import respond_zk
    from dk.vectors.pol import npz_bytes
    from dk.verifier import verify_bundle
    from dk.verifier.challenge import challenge_document

    rng = np.random.default_rng(3)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    y = (x @ rng.normal(size=(4, 2)) * 0.5).astype(np.float32)
    (out / "zk-data.npz").write_bytes(npz_bytes({"X": x, "y": y}))
    saved = dict(os.environ)
    os.environ.update(zk_env(root, tmp / "zk-cache"))
    try:
        job = default_job(arch="linear", mode="zk", dataset="npz", data_path="zk-data.npz",
                          steps=4, interval=2, batch_size=2, loss="mse", lr=0.1, base_dir=out,
                          pol={"zk": {**TINY_ZK, "srs": os.environ["DK_ZK_SRS_SHA256"]}},
                          init_extra=zk_init_extra)  # fmt: skip
        (out / "job-zk.toml").write_text(job.to_toml(), encoding="utf-8")
        train(job, tmp / "zk-run")
        committed = prove_run(tmp / "zk-run", job, WORKER, tmp / "zk-committed")
        pre = verify_bundle(committed, job, beacon=bytes.fromhex(BEACON), samples=2, topq=0,
                            replay=False)  # fmt: skip
        assert pre.ok and pre.challenged == [0, 1], pre.codes
        (tmp / "challenge.json").write_bytes(canonical_json(challenge_document(pre)))
        answered = respond_zk(tmp / "zk-run", job, WORKER, tmp / "zk-honest",
                              challenge=tmp / "challenge.json")  # fmt: skip
    finally:
        os.environ.clear()
        os.environ.update(saved)
    _copy_real(committed, out / "zk-committed")
    _copy_real(answered, out / "zk-honest")
    _copy_real(answered, out / "zk-tampered-proof")
    p = out / "zk-tampered-proof" / "proofs" / "interval-1.json"
    records = json.loads(p.read_text())
    proof = bytearray(bytes.fromhex(records[0]["proof"]))
    proof[100] ^= 1
    records[0]["proof"] = proof.hex()
    p.write_text(json.dumps(records))


def _zk_out_of_range(src: Path, dst: Path) -> None:
    """Checkpoint 1 with one weight of 1e6 (finite, but 1e6 · 2^12 is outside the circuit's
    quantisation range), re-committed and re-signed: no weight a proven step produced, so its
    zk/params_digest cannot be its weights' (ZK_INSTANCE_MISMATCH, not an internal error)."""
    if dst.exists():
        shutil.rmtree(dst)
    f = Forgery(src, dst)
    t = f.tensors(1)
    name = sorted(k for k in t if k.startswith("model/"))[0]
    t[name] = t[name].copy()
    t[name].reshape(-1)[0] = np.float32(1e6)
    f.put(1, t)
    f.commit(WORKER)


def zk_cases(root: Path) -> list[dict[str, Any]]:
    """Cases of the zk bundles: they need EZKL and the checked-in SRS."""
    srs_sha = hashlib.sha256((root / SRS).read_bytes()).hexdigest()
    zk = {"samples": 2, "verify": {"topq": 0}, "requires": "ezkl",
          "srs": {"path": SRS, "sha256": srs_sha, "kind": "local"}}  # fmt: skip
    return [
        _case("zk mode: both intervals challenged and proven (local SRS: insecure-srs flag)",
              "zk-honest", "job-zk.toml", "valid", **zk),
        _case("zk mode: a byte of a proof of interval 1 flipped", "zk-tampered-proof",
              "job-zk.toml", "invalid", "ZK_PROOF_INVALID", **zk),
        _case("zk mode: a weight of checkpoint 1 outside the quantisation range (re-committed)",
              "zk-weights-out-of-range", "job-zk.toml", "invalid", "ZK_INSTANCE_MISMATCH",
              **zk),
        _case("zk mode: the committed bundle, before it answered the challenge",
              "zk-committed", "job-zk.toml", "invalid", "ZK_PROOF_MISSING", **zk),
    ]  # fmt: skip


def report_cases(out: Path) -> list[dict[str, Any]]:
    """Report bodies (SPEC §14.2): an accept of the honest bundle, a reject with several
    reasons and a flag; digests computed wrongly."""
    from dk.verifier import verify_bundle

    rep = verify_bundle(out / "honest", out / "job.toml", beacon=bytes.fromhex(BEACON),
                        samples=2, topq=0)  # fmt: skip
    assert rep.ok, rep.codes
    accept = rep.attestation_body()
    srs = {"sha256": hashlib.sha256((out.parent / SRS).read_bytes()).hexdigest(), "kind": "local"}
    # the replay step judges every challenged interval, so a zk report may hold two codes
    reject = dict(accept, verdict="reject", reasons=["ZK_PROOF_INVALID", "ZK_PROOF_MISSING"],
                  flags=["insecure-srs"], mode="zk", srs=srs)  # fmt: skip
    bad = out / "honest-version-3"  # stopped at step 2 of SPEC §12.2: empty fields (§14.2)
    shutil.copytree(out / "honest", bad)
    try:
        m = bad / "manifest.json"
        m.write_bytes(m.read_bytes().replace(b'"version":2', b'"version":3'))
        early = verify_bundle(
            bad, out / "job.toml", beacon=bytes.fromhex(BEACON)
        ).attestation_body()
    finally:
        shutil.rmtree(bad)
    assert early["reasons"] == ["UNSUPPORTED_VERSION"] and early["job_id"] == "", early
    cases: list[dict[str, Any]] = []
    for comment, body in (("accept of vectors/modes/honest, beacon 00..00, s = 2", accept),
                          ("zk reject with two reasons, a flag and the SRS", reject),
                          ("reject stopped at the manifest (version 3): job_id, worker_key, "
                           "transcript_root, beacon empty, challenged []", early)):  # fmt: skip
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
    if (out / "zk-committed").is_dir():
        import os

        saved = dict(os.environ)
        with tempfile.TemporaryDirectory() as tmp_s:
            os.environ.update(zk_env(out.parent, Path(tmp_s)))
            try:
                zpre = verify_bundle(out / "zk-committed", out / "job-zk.toml",
                                     beacon=bytes.fromhex(BEACON), samples=2, topq=0,
                                     replay=False)  # fmt: skip
            finally:
                os.environ.clear()
                os.environ.update(saved)
        zdoc = challenge_document(zpre)
        srs_sha = hashlib.sha256((out.parent / SRS).read_bytes()).hexdigest()
        for comment, d, reason in (
            ("zk: the challenge the zk bundle answers (both intervals)", zdoc, ""),
            ("zk: only interval 0", dict(zdoc, intervals=[0]), "CHALLENGE_MISMATCH"),
        ):
            c = {"tcId": len(cases) + 1, "comment": comment,
                 "result": "invalid" if reason else "valid", "document": canonical_json(d).hex(),
                 "dir": "zk-committed", "job": "job-zk.toml", "samples": 2, "topq": 0,
                 "requires": "ezkl",
                 "srs": {"path": SRS, "sha256": srs_sha, "kind": "local"}}  # fmt: skip
            if reason:
                c["expected_reason"] = reason
            cases.append(c)
    return cases


def generate(root: Path) -> None:
    """Write ``root/modes/``: bundles, cases, report digests and challenge documents.

    The zk bundles hold random proofs: existing ones are kept (delete ``modes/zk-*`` to make
    new ones, which needs EZKL); without EZKL and without them, the zk cases are left out.
    """
    out = root / "modes"
    with tempfile.TemporaryDirectory() as tmp_s, _blobs_in_name_order():
        tmp = Path(tmp_s)
        keep = tmp / "keep"
        keep.mkdir()
        for name in ZK_KEEP:
            if (out / name).exists():
                shutil.move(str(out / name), str(keep / name))
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for name in ZK_KEEP:
            if (keep / name).exists():
                shutil.move(str(keep / name), str(out / name))
        cases = bundle_cases(out, tmp)
        if not (out / "zk-honest").is_dir():
            try:
                import ezkl  # noqa: F401
            except ImportError:
                pass
            else:
                zk_bundles(root, out, tmp)
    if (out / "zk-honest").is_dir():
        _zk_out_of_range(out / "zk-honest", out / "zk-weights-out-of-range")
        cases += zk_cases(root)
    for n, c in enumerate(cases, 1):
        c["tcId"] = n
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
