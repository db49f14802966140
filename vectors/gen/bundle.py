"""Generator of the bundle vectors (SPEC §11-§12): ``vectors/bundle/``.

One tiny honest bundle (digits, MLP 64-8-10, 20 steps, k = 5, worker seed ``bytes(range(32))``)
and one invalid bundle per forgery class of ``vectors/gen/forge.py``, each in its own
directory, plus ``cases.json`` listing how to verify each one and the expected verdict and
first reason code. Cases that would need a large or unusual file are stored as recipes the
checker applies to a temporary copy: ``pad_manifest_to`` (trailing spaces up to that size)
and ``symlink`` (replace a blob by a symbolic link to a renamed copy).

Training is single-threaded and deterministic (exact mode), so a rerun on the same platform
reproduces every byte; blobs are written as real files (runs hardlink them).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dk.crypto.keys import SigningKey
from dk.pol.jobinit import default_job
from dk.pol.transcript import MAX_MANIFEST_BYTES
from dk.vectors import write_cases
from dk.vectors.bundle import run_case, verify_case
from vectors.gen import forge
from vectors.gen.forge import FORGERIES, STOLEN, Forgery

WORKER = SigningKey(bytes(range(32)))
BEACON = bytes(32).hex()
ALL = 1000  # samples: every interval is replayed, so verdicts do not depend on the draw


def tiny_job(**kw: Any) -> Any:
    """The tiny job of the vectors (same as ``tests/helpers.tiny_job``)."""
    args: dict[str, Any] = dict(hidden=[8], steps=20, interval=5, batch_size=16)
    args.update(kw)
    return default_job(**args)


@contextmanager
def _blobs_in_name_order() -> Iterator[None]:
    """Make the forger read checkpoint tensors in name order while generating.

    ``safetensors`` returns a blob's tensors in an order that changes from process to process;
    the forgers sum update norms and draw random weights in that order, so without this the
    forged manifests would differ in their last bits between runs.
    """
    original = forge.parse_blob

    def ordered(data: bytes) -> dict[str, Any]:
        return dict(sorted(original(data).items()))

    forge.parse_blob = ordered
    try:
        yield
    finally:
        forge.parse_blob = original


def _other_data_root(f: Forgery, key: SigningKey) -> Path:
    f.m["data_root"] = bytes(32).hex()
    return f.commit(key)


def _batch(f: Forgery, key: SigningKey) -> Path:
    f.m["intervals"][1]["batch_commitment"] = f.m["intervals"][2]["batch_commitment"]
    return f.commit(key)


def _norm(f: Forgery, key: SigningKey) -> Path:
    f.m["intervals"][1]["update_norm"] *= 1.001
    return f.commit(key)


def _steps(f: Forgery, key: SigningKey) -> Path:
    f.m["checkpoints"][1]["step"] = 4
    f.m["intervals"][0]["end_step"] = f.m["intervals"][1]["start_step"] = 4
    return f.commit(key)


def _garbage_blob(f: Forgery, key: SigningKey) -> Path:
    (f.dir / f.m["checkpoints"][2]["blob"]).write_bytes(b"not safetensors")
    return f.dir


# More forgeries than vectors/gen/forge.py holds, built with its toolkit: one per reason code
# of SPEC §12.2 that no forgery there reaches first.
EXTRA_FORGERIES = {
    "other-data-root": (_other_data_root, "DATA_MISMATCH"),
    "batch-commitment-swapped": (_batch, "BATCH_MISMATCH"),
    "update-norm-inflated": (_norm, "METADATA_MISMATCH"),
    "checkpoint-steps-shifted": (_steps, "TRANSCRIPT_MALFORMED"),
    "garbage-blob": (_garbage_blob, "BLOB_MALFORMED"),
}


def _copy_real(src: Path, dst: Path) -> None:
    """Copy a bundle with every blob as a real file (symbolic links are dropped)."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, symlinks=True)
    for p in sorted(dst.rglob("*")):
        if p.is_symlink():
            p.unlink()


def _case(
    comment: str,
    directory: str,
    result: str,
    reason: str | None = None,
    job: str = "job.toml",
    **extra: Any,
) -> dict[str, Any]:
    c: dict[str, Any] = {
        "comment": comment,
        "dir": directory,
        "job": job,
        "beacon": BEACON,
        "samples": ALL,
        "verify": extra.pop("verify", {}),
        "result": result,
    }
    if reason:
        c["expected_reason"] = reason
    c.update(extra)
    return c


def generate(root: Path) -> None:
    """Train and prove the honest bundle, forge the invalid ones, write ``root/bundle/``."""
    from dk.pol import train_job
    from dk.prover import prove_run

    out = root / "bundle"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    job = tiny_job()
    (out / "job.toml").write_text(job.to_toml(), encoding="utf-8")
    (out / "job-seed1.toml").write_text(tiny_job(seed=1).to_toml(), encoding="utf-8")
    named = job.with_updates(pol={"worker": WORKER.verify_key.hex()})
    (out / "job-named-worker.toml").write_text(named.to_toml(), encoding="utf-8")
    cases: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp_s, _blobs_in_name_order():
        tmp = Path(tmp_s)
        train_job(job, tmp / "run")
        honest = prove_run(tmp / "run", job, WORKER, tmp / "honest")
        _copy_real(honest, out / "honest")
        cases.append(
            _case(
                "honest tiny bundle (every interval commits its replayed loss, SPEC §11.7)",
                "honest",
                "valid",
            )
        )
        cases.append(
            _case(
                "honest bundle, verifier names its worker",
                "honest",
                "valid",
                verify={"worker": WORKER.verify_key.hex()},
            )
        )
        for name in [*sorted(FORGERIES), *EXTRA_FORGERIES]:
            forger, reason = FORGERIES.get(name) or EXTRA_FORGERIES[name]
            forged = forger(Forgery(honest, tmp / name), WORKER)
            extra: dict[str, Any] = {}
            if name == "symlinked-blob":
                link = next(p for p in sorted(forged.rglob("*")) if p.is_symlink())
                extra["symlink"] = {
                    "link": link.relative_to(forged).as_posix(),
                    "target": link.readlink().as_posix(),
                }
            _copy_real(forged, out / name)
            cases.append(_case(f"forgery: {name}", name, "invalid", reason, **extra))
        label, steal, reason = STOLEN
        stolen = steal(Forgery(honest, tmp / label), WORKER)
        _copy_real(stolen, out / label)
        cases.append(
            _case(
                "transcript re-signed by a thief, verifier names the worker",
                label,
                "invalid",
                reason,
                verify={"worker": WORKER.verify_key.hex()},
            )
        )
        cases.append(
            _case(
                "transcript re-signed by a thief, job names the worker (so its job_id differs)",
                label,
                "invalid",
                "JOB_MISMATCH",
                job="job-named-worker.toml",
            )
        )
        cases.append(
            _case("transcript re-signed by a thief, nobody names the worker", label, "valid")
        )
    cases.append(
        _case(
            "manifest of 4 MiB + 1 byte (recipe)",
            "honest",
            "invalid",
            "MANIFEST_TOO_LARGE",
            pad_manifest_to=MAX_MANIFEST_BYTES + 1,
        )
    )
    cases.append(
        _case(
            "honest bundle against a different job",
            "honest",
            "invalid",
            "JOB_MISMATCH",
            job="job-seed1.toml",
        )
    )
    cases.append(
        _case(
            "bundle directory missing (the verifier's own input: inconclusive)",
            "absent",
            "invalid",
            "BUNDLE_NOT_FOUND",
            expected_verdict="inconclusive",
        )
    )
    (out / "job-malformed.toml").write_text("[model]\narch = 'transformer'\n", encoding="utf-8")
    cases.append(
        _case(
            "malformed job file (the verifier's own input: inconclusive)",
            "honest",
            "invalid",
            "JOB_MALFORMED",
            job="job-malformed.toml",
            expected_verdict="inconclusive",
        )
    )
    honest_root = json.loads((out / "honest" / "manifest.json").read_text())["transcript_root"]
    cases.append(
        _case(
            "challenge pins the committed root (SPEC §12.1)",
            "honest",
            "valid",
            verify={"root": honest_root},
        )
    )
    cases.append(
        _case(
            "bundle under another root than the challenged one (re-committed after the beacon)",
            "honest",
            "invalid",
            "ROOT_NOT_CHALLENGED",
            verify={"root": bytes(32).hex()},
        )
    )
    last_blob = json.loads((out / "honest" / "manifest.json").read_text())["checkpoints"][-1]
    flip = bytearray((out / "honest" / last_blob["blob"]).read_bytes())
    flip[-3] ^= 1
    for integrity, result, reason in (
        ("challenged", "valid", None),
        ("all", "invalid", "COMMITMENT_MISMATCH"),
    ):
        cases.append(
            _case(
                f"final blob damaged, no interval challenged, integrity = {integrity!r} "
                "(challenged fetches only what the challenge needs, SPEC §12.2)",
                "honest",
                result,
                reason,
                samples=0,
                verify={"integrity": integrity, "topq": 0},
                write={last_blob["blob"]: bytes(flip).hex()},
            )
        )
    sig = (out / "honest" / "signature.hex").read_bytes()
    manifest = (out / "honest" / "manifest.json").read_bytes()
    recipes: list[tuple[str, str, dict[str, Any]]] = [
        ("manifest.json removed", "MANIFEST_MISSING", {"remove": ["manifest.json"]}),
        ("signature.hex removed", "SIGNATURE_MISSING", {"remove": ["signature.hex"]}),
        (
            "signature.hex not hex",
            "SIGNATURE_INVALID",
            {"write": {"signature.hex": (b"zz" * 64 + b"\n").hex()}},
        ),
        (
            "signature.hex over 256 bytes",
            "SIGNATURE_INVALID",
            {"write": {"signature.hex": (sig.strip() + b" " * 200 + b"\n").hex()}},
        ),
        (
            "manifest version 3",
            "UNSUPPORTED_VERSION",
            {"write": {"manifest.json": manifest.replace(b'"version":2', b'"version":3').hex()}},
        ),
    ]
    # SPEC §10.3: checkpoint 1's blob rewritten at its committed size (so the size check
    # passes and the parse decides)
    blob1 = json.loads(manifest)["checkpoints"][1]["blob"]
    b1 = (out / "honest" / blob1).read_bytes()
    f16 = b1.replace(
        b'"model/fc1.bias":{"dtype":"F32","shape":[10]',
        b'"model/fc1.bias":{"dtype":"F16","shape":[20]',
    )
    dup = b1.replace(b'"model/fc1.bias":', b'"model/fc0.bias":')
    assert len(f16) == len(dup) == len(b1) and f16 != b1 and dup != b1
    recipes += [
        (
            "blob of the committed size that is not safetensors",
            "BLOB_MALFORMED",
            {"write": {blob1: bytes(len(b1)).hex()}},
        ),
        (
            "blob of the committed size with a float16 tensor (not a SPEC §4.1 dtype)",
            "BLOB_MALFORMED",
            {"write": {blob1: f16.hex()}},
        ),
        (
            "blob of the committed size with a duplicate tensor name",
            "BLOB_MALFORMED",
            {"write": {blob1: dup.hex()}},
        ),
    ]
    for why, reason, recipe in recipes:
        cases.append(_case(why, "honest", "invalid", reason, **recipe))
    cases.append(
        _case(
            "signature.hex without its newline",
            "honest",
            "valid",
            write={"signature.hex": sig.strip().hex()},
        )
    )
    for i, c in enumerate(cases, 1):
        c["tcId"] = i
    for c in cases:  # the report digest of every case (SPEC §14.2)
        c["report_digest"] = verify_case(root, c).digest().hex()
    for c in cases:  # refuse to write a case the library does not reproduce
        msg = run_case(root, c)
        assert not msg, (c["comment"], msg)
    write_cases(
        out / "cases.json",
        "bundle",
        cases,
        worker_key=WORKER.verify_key.hex(),
        worker_seed=bytes(range(32)).hex(),
    )
