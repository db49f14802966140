"""Answer a verifier's challenge with EZKL proofs of exactly the challenged intervals.

``dk prove RUN --job job.toml --key K --respond challenge.json --zk --out BUNDLE`` writes the
bundle (as :func:`dk.prover.prove_run` does) plus ``proofs/interval-<i>.json`` for every
challenged interval ``i``, listed in the manifest's ``proofs``. The transcript root, hence the
signature, is unchanged by the proofs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from dk.crypto.keys import SigningKey
from dk.errors import FormatError
from dk.pol.challenge_doc import MAX_CHALLENGE_BYTES, parse_challenge, proof_file
from dk.pol.data import load_dataset
from dk.pol.job import JobSpec, as_job
from dk.pol.pack import RunBlobs
from dk.pol.run import atomic_write, read_run
from dk.pol.sampler import job_sampler
from dk.prover.bundle import build_manifest, sign_manifest, write_bundle


def respond_zk(
    run_dir: str | Path,
    job: JobSpec | str | Path,
    key: SigningKey,
    out_dir: str | Path,
    *,
    challenge: str | Path,
    progress: Any = None,
) -> Path:
    """Write a bundle with zk proofs of the challenged intervals.

    Args:
        run_dir: the zk-mode run.
        job: its job (``pol.mode = "zk"``).
        key: the worker's key (the same that signed the committed bundle).
        out_dir: bundle directory (created, or the committed bundle of the same transcript).
        challenge: the verifier's ``challenge.json``.
        progress: optional ``callable(done, total)`` after each proven step.

    Raises:
        FormatError: the challenge is for another job or transcript, or the run is unusable.
    """
    from dk.circuits.session import circuit_for_job, prove_interval_from

    job = as_job(job)
    if job.mode != "zk":
        raise FormatError("--zk needs a job with pol.mode = 'zk'")
    run_dir, out = Path(run_dir), Path(out_dir)
    p = Path(challenge)
    with open(p, "rb") as f:
        doc = parse_challenge(f.read(MAX_CHALLENGE_BYTES + 1))
    run = read_run(run_dir)
    if not run.complete or run.job_id != job.job_id.hex():
        raise FormatError("the run is incomplete or was trained for another job")
    m = build_manifest(run, key.verify_key.raw)
    if doc["job_id"] != m["job_id"] or doc["transcript_root"] != m["transcript_root"]:
        raise FormatError("the challenge is for another job or transcript (or another worker key)")
    intervals: list[int] = list(cast("list[int]", doc["intervals"]))
    if any(i >= len(m["intervals"]) for i in intervals):
        raise FormatError("the challenge names an interval the run does not have")
    circ = circuit_for_job(job)
    ds = load_dataset(job)
    sampler = job_sampler(job, len(ds))
    (out / "blobs").mkdir(parents=True, exist_ok=True)
    (out / "proofs").mkdir(exist_ok=True)
    blobs = RunBlobs(run_dir)  # packed or files (SPEC §11.8), each checked against its root
    total = sum(m["intervals"][i]["end_step"] - m["intervals"][i]["start_step"] for i in intervals)
    done = 0
    for i in intervals:
        iv, cks = m["intervals"][i], m["checkpoints"]
        start = blobs.checkpoint(bytes.fromhex(cks[i]["root"]), cks[i]["nbytes"])
        batches = []
        for t in range(iv["start_step"], iv["end_step"]):
            idx = sampler.batch(t)
            batches.append((ds.X[idx], ds.y[idx]))
        records = prove_interval_from(circ, [start], batches)
        if records and records[-1]["claims"]["params_out"] != _end_digest(circ, blobs, cks[i + 1]):
            raise FormatError(f"interval {i} of the run is not the circuit's steps (not a zk run?)")
        atomic_write(out / proof_file(i), json.dumps(records, sort_keys=True).encode())
        done += len(batches)
        if progress is not None:
            progress(done, total)
    for ck in m["checkpoints"]:
        blobs.export(bytes.fromhex(ck["root"]), ck["nbytes"], out / ck["blob"])
    m["proofs"] = [{"interval": i, "file": proof_file(i)} for i in intervals]
    write_bundle(out, m, sign_manifest(m, key))
    return out


def _end_digest(circ: Any, blobs: RunBlobs, ck: dict[str, Any]) -> str:
    """The circuit's params digest of a committed checkpoint of the run."""
    from dk.pol.checkpoint import model_tensors

    tensors = blobs.checkpoint(bytes.fromhex(ck["root"]), ck["nbytes"])
    return circ.params_digest(model_tensors(tensors))
