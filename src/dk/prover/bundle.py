"""Turn a recorded run into a signed bundle directory (SPEC §11.3).

Bundle layout::

    BUNDLE/manifest.json                       canonical JSON (SPEC §11.2)
    BUNDLE/signature.hex                       Ed25519 signature, 128 hex characters
    BUNDLE/blobs/<checkpoint root>.safetensors content-addressed checkpoints
    BUNDLE/logs/<log digest>.dkrl             rounding logs (pol.backend = "rounded", SPEC VI)
    BUNDLE/proofs/…                            optional zk proofs (SPEC §13)

The run keeps its blobs packed (``blobs.pack``, SPEC §11.8) or as files (large checkpoints,
runs recorded before packs); the bundle always holds one file per blob, so its bytes do not
depend on how the run stored them. A packed blob is checked against its root before it is
written into the bundle (:meth:`dk.pol.pack.RunBlobs.export`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dk.crypto.keys import SigningKey
from dk.errors import FormatError
from dk.pol.checkpoint import blob_name
from dk.pol.job import JobSpec, as_job
from dk.pol.pack import RunBlobs
from dk.pol.run import atomic_write, read_run
from dk.pol.transcript import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    Manifest,
    signing_digest,
    transcript_root,
)


def build_manifest(run: Any, worker_key: bytes) -> dict[str, Any]:
    """The manifest dict of a run, with its transcript root."""
    m: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "version": BUNDLE_VERSION,
        "job_id": run.job_id,
        "worker_key": worker_key.hex(),
        "data_root": run.data_root,
        "interval": run.interval,
        "steps": run.steps,
        "chunk_size": 65536,
        "checkpoints": [
            {
                "index": c.index,
                "step": c.step,
                "root": c.root,
                "blob": blob_name(bytes.fromhex(c.root)),
                "nbytes": c.nbytes,
            }
            for c in run.checkpoints
        ],
        "intervals": [
            {
                "index": i.index,
                "start_step": i.start_step,
                "end_step": i.end_step,
                "batch_commitment": i.batch_commitment,
                "update_norm": i.update_norm,
                **({"ext": i.ext} if i.ext is not None else {}),
            }
            for i in run.intervals
        ],
    }
    if run.ext is not None:
        m["ext"] = run.ext
    m["transcript_root"] = transcript_root(m).hex()
    return m


def sign_manifest(m: dict[str, Any], key: SigningKey) -> bytes:
    """Ed25519 signature over the manifest's signing digest."""
    digest = signing_digest(
        bytes.fromhex(m["job_id"]),
        bytes.fromhex(m["transcript_root"]),
        bytes.fromhex(m["worker_key"]),
    )
    return key.sign(digest)


def write_bundle(out: Path, m: dict[str, Any], signature: bytes) -> None:
    """Write ``manifest.json`` and ``signature.hex`` into ``out``."""
    atomic_write(out / "manifest.json", Manifest(m).to_bytes())
    atomic_write(out / "signature.hex", signature.hex().encode() + b"\n")


def _copy(src: Path, dst: Path) -> None:
    """A copy, never a hard link: editing a bundle's file must not edit the run's."""
    if not dst.exists():
        shutil.copyfile(src, dst)


def prove_run(
    run_dir: str | Path, job: JobSpec | str | Path, key: SigningKey, out_dir: str | Path
) -> Path:
    """Make a signed bundle of the run in ``run_dir`` for ``job``.

    Args:
        run_dir: a complete run directory (from ``dk train`` or a :class:`Recorder`).
        job: the job the run trained.
        key: the worker's signing key.
        out_dir: bundle directory to create (must not hold a bundle already).

    Returns:
        The bundle directory.

    Raises:
        FormatError: the run is incomplete, or was trained for another job.
    """
    job = as_job(job)
    run_dir, out = Path(run_dir), Path(out_dir)
    run = read_run(run_dir)
    if not run.complete:
        raise FormatError(f"run {run_dir} is incomplete")
    if run.job_id != job.job_id.hex():
        raise FormatError("the run was trained for a different job (job_id differs)")
    if (out / "manifest.json").exists():
        raise FileExistsError(f"{out} already holds a bundle")
    (out / "blobs").mkdir(parents=True, exist_ok=True)
    m = build_manifest(run, key.verify_key.raw)
    if job.world_size > 1:  # SPEC §11.6: every rank signed this root
        m["rank_signatures"] = rank_signatures_for(run_dir, m)
        _copy_rank_steps(run_dir, out, m, tolerant=job.mode == "tolerant")
    blobs = RunBlobs(run_dir)
    for ck in m["checkpoints"]:
        blobs.export(bytes.fromhex(ck["root"]), ck["nbytes"], out / ck["blob"])
    for iv in m["intervals"]:  # SPEC VI §4: a rounded run's per-interval logs
        log = iv.get("ext", {}).get("rounding_log")
        if log is not None:
            src = run_dir / log["blob"]
            if not src.is_file():
                raise FormatError(f"run is missing rounding log {log['blob']}")
            (out / "logs").mkdir(exist_ok=True)
            _copy(src, out / log["blob"])
    write_bundle(out, m, sign_manifest(m, key))
    return out


def rank_signatures_for(run_dir: Path, m: dict[str, Any]) -> list[str]:
    """The ranks' signatures of a data-parallel run, checked against the manifest ``m``.

    Raises:
        FormatError: no signatures (a rank failed before signing), or signatures over another
            root (the run was proved with another key than rank 0's).
    """
    from dk.crypto.keys import VerifyKey
    from dk.pol.rank_ext import rank_signing_digest, read_rank_signatures

    doc = read_rank_signatures(run_dir)
    ranks = (m.get("ext") or {}).get("ranks") or []
    if doc.get("transcript_root") != m["transcript_root"]:
        raise FormatError(
            "the ranks signed another transcript root: prove a data-parallel run with rank 0's "
            f"key ({ranks[0]['worker_key'][:16]}…)"
            if ranks
            else "the run names no ranks"
        )
    sigs = doc["rank_signatures"]
    job_id, root = bytes.fromhex(m["job_id"]), bytes.fromhex(m["transcript_root"])
    if len(sigs) != len(ranks):
        raise FormatError(f"{len(sigs)} rank signatures for {len(ranks)} ranks")
    for r, (sig, entry) in enumerate(zip(sigs, ranks, strict=True)):
        k = bytes.fromhex(entry["worker_key"])
        try:
            raw = bytes.fromhex(sig)
        except (TypeError, ValueError):
            raw = b""
        if not VerifyKey(k).verify(raw, rank_signing_digest(job_id, root, r, k)):
            raise FormatError(f"rank {r}'s signature does not verify")
    return list(sigs)


def _copy_rank_steps(run_dir: Path, out: Path, m: dict[str, Any], *, tolerant: bool) -> None:
    """``ranks/<i>.bin`` (each rank's step digests, SPEC §11.6) into the bundle, and in
    tolerant mode ``ranks/<i>.msg`` (the messages themselves)."""
    from dk.pol.rank_ext import RANK_MESSAGES_SUFFIX, RANK_STEPS_DIR

    (out / RANK_STEPS_DIR).mkdir(exist_ok=True)
    for iv in m["intervals"]:
        for suffix in (".bin", RANK_MESSAGES_SUFFIX) if tolerant else (".bin",):
            name = f"{RANK_STEPS_DIR}/{iv['index']}{suffix}"
            if not (run_dir / name).is_file():
                raise FormatError(f"run is missing {name}")
            _copy(run_dir / name, out / name)


def train(
    job: JobSpec | str | Path, run_dir: str | Path, *, progress: Any = None, resume: bool = False
) -> Any:
    """Train a job with recording, whatever its mode (zk jobs step through their circuit).

    ``resume``: continue an interrupted run in ``run_dir`` (not for zk jobs yet).
    """
    job = as_job(job)
    if job.mode == "zk":
        from dk.circuits.session import train_zk
        from dk.pol.resume import has_partial_run

        if resume and has_partial_run(run_dir):
            raise FormatError(f"{run_dir}: a zk run cannot resume yet; train into a new directory")
        return train_zk(job, run_dir, progress=progress)
    from dk.pol.train import train_job

    return train_job(job, run_dir, progress=progress, resume=resume)
