"""``verify_bundle``: the verifier's whole procedure (SPEC §12), total by construction.

Malformed input never raises: every failure becomes a :class:`Finding` with a reason code in
the returned :class:`Report`. The verifier imports only ``dk.crypto`` and ``dk.pol``.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dk.crypto.hashing import digests_equal
from dk.crypto.keys import VerifyKey
from dk.errors import BackendUnavailable, FormatError
from dk.pol.checkpoint import (
    blob_name,
    check_schema,
    checkpoint_root,
    hparam_tensors,
    initial_checkpoint,
    parse_blob,
    read_blob_file,
    update_norm,
)
from dk.pol.data import Dataset, check_dims, load_dataset
from dk.pol.job import JobSpec, as_job
from dk.pol.sampler import job_sampler
from dk.pol.transcript import (
    MAX_MANIFEST_BYTES,
    Manifest,
    parse_manifest,
    signing_digest,
    transcript_root,
)
from dk.verifier.challenge import derive_challenge, detection_probability, samples_for
from dk.verifier.report import Reason, Report

MAX_SIGNATURE_FILE = 256
NORM_RTOL = 1e-9


class _Reject(Exception):
    """Internal: stop verification after a fatal finding (already recorded)."""


def _read_bounded(path: Path, limit: int, missing: Reason, too_large: Reason) -> bytes:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise FormatError(f"{path.name} is missing", reason=missing.value) from None
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{path.name} is not a regular file", reason=Reason.BAD_PATH.value)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FormatError(f"{path.name} is over {limit} bytes", reason=too_large.value)
    return data


def _fatal(rep: Report, check: str, e: FormatError, default: Reason) -> None:
    code = Reason(e.reason) if e.reason in Reason.__members__ else default
    rep.fail(check, code, str(e))
    raise _Reject


def verify_bundle(
    bundle: str | os.PathLike[str],
    job: JobSpec | str | os.PathLike[str],
    *,
    beacon: bytes | None = None,
    samples: int | None = None,
    topq: int = 1,
    workers: int = 1,
    skipped_fraction: float = 0.1,
    detect: float = 0.99,
    worker: str | None = None,
    dataset: Dataset | None = None,
    integrity: str = "all",
    replay: bool = True,
) -> Report:
    """Verify a bundle against a job; never raises on bad input.

    Args:
        bundle: the bundle directory.
        job: the job (or path to ``job.toml``) the consumer published.
        beacon: entropy fixed after the worker committed (a verifier nonce or the market
            ledger head). ``None`` draws a fresh 32-byte nonce from the OS.
        samples: uniform interval samples ``s``; ``None`` picks the smallest ``s`` that detects
            a worker who skipped ``skipped_fraction`` of the intervals with probability
            ``detect``.
        topq: intervals with the largest claimed update per epoch, added to the sample.
        workers: local processes replaying in parallel.
        skipped_fraction: the skipped fraction the detection figure is reported for.
        detect: target detection probability when ``samples`` is ``None``.
        worker: hex public key the bundle must be signed by (default: the job's
            ``pol.worker``, if set).
        dataset: the verifier's copy of the data (default: load what the job names).
        integrity: ``"all"`` checks every blob against its commitment (default);
            ``"challenged"`` fetches and checks only the checkpoints the challenge needs, as a
            verifier of a remote bundle would (DESIGN §4); the report says which was done.
        replay: False stops after deriving the challenge and checking integrity (what
            ``dk challenge`` does); the report's ``replay`` check is then ``"skip"``.

    Returns:
        The :class:`Report` (``report.ok`` is the verdict).
    """
    rep = Report()
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    try:
        if integrity not in ("all", "challenged"):
            raise ValueError("integrity must be 'all' or 'challenged'")
        _verify(
            rep,
            Path(bundle),
            job,
            beacon,
            samples,
            topq,
            workers,
            skipped_fraction,
            detect,
            worker,
            dataset,
            integrity,
            replay,
        )
    except _Reject:
        pass
    except Exception as e:  # totality: a bug or an unforeseen input still yields a report
        rep.fail("internal", Reason.INTERNAL_ERROR, f"{type(e).__name__}: {e}")
    rep.figures["verify_wall_s"] = round(time.perf_counter() - t_wall, 4)
    rep.figures["verify_cpu_s"] = round(
        time.process_time() - t_cpu + rep.figures.get("replay_cpu_s_workers", 0.0), 4
    )
    return rep


def _verify(
    rep: Report,
    bundle: Path,
    job_in: Any,
    beacon: bytes | None,
    samples: int | None,
    topq: int,
    workers: int,
    f: float,
    detect: float,
    worker: str | None,
    dataset: Dataset | None,
    integrity: str = "all",
    replay: bool = True,
) -> None:
    # 1. inputs --------------------------------------------------------------------------
    if not bundle.is_dir():
        rep.fail("bundle", Reason.BUNDLE_NOT_FOUND, f"bundle directory not found: {bundle}")
        raise _Reject
    try:
        job = as_job(job_in)
    except FormatError as e:
        _fatal(rep, "job", e, Reason.JOB_MALFORMED)
    rep.mode = job.mode
    try:
        raw_manifest = _read_bounded(
            bundle / "manifest.json",
            MAX_MANIFEST_BYTES,
            Reason.MANIFEST_MISSING,
            Reason.MANIFEST_TOO_LARGE,
        )
        man: Manifest = parse_manifest(raw_manifest)
    except FormatError as e:
        _fatal(rep, "manifest", e, Reason.MANIFEST_MALFORMED)
    if raw_manifest != man.to_bytes():  # SPEC §11.2: the manifest is canonical JSON
        rep.fail("manifest", Reason.MANIFEST_MALFORMED, "manifest.json is not canonical JSON")
        raise _Reject
    rep.passed("manifest")
    m = man.raw
    rep.job_id, rep.worker_key, rep.transcript_root = (
        m["job_id"],
        m["worker_key"],
        m["transcript_root"],
    )

    # 2. transcript root and signature ---------------------------------------------------
    if not digests_equal(transcript_root(m), man.transcript_root):
        rep.fail(
            "transcript_root",
            Reason.TRANSCRIPT_ROOT_MISMATCH,
            "transcript_root does not match the manifest's entries",
        )
        raise _Reject
    rep.passed("transcript_root")
    try:
        sig_raw = _read_bounded(
            bundle / "signature.hex",
            MAX_SIGNATURE_FILE,
            Reason.SIGNATURE_MISSING,
            Reason.SIGNATURE_INVALID,
        )
    except FormatError as e:
        _fatal(rep, "signature", e, Reason.SIGNATURE_INVALID)
    sig_text = sig_raw[:-1] if sig_raw.endswith(b"\n") else sig_raw
    if len(sig_text) != 128 or not set(sig_text) <= set(b"0123456789abcdef"):  # SPEC §11.3
        rep.fail(
            "signature",
            Reason.SIGNATURE_INVALID,
            "signature.hex must be 128 lowercase hex characters",
        )
        raise _Reject
    sig = bytes.fromhex(sig_text.decode("ascii"))
    key = VerifyKey(man.worker_key)
    if not key.verify(sig, signing_digest(man.job_id, man.transcript_root, man.worker_key)):
        rep.fail("signature", Reason.SIGNATURE_INVALID, "Ed25519 signature does not verify")
        raise _Reject
    rep.passed("signature")

    # 3. job binding ---------------------------------------------------------------------
    if not digests_equal(man.job_id, job.job_id):
        rep.fail("job", Reason.JOB_MISMATCH, "bundle is for a different job (job_id differs)")
        raise _Reject
    expected_worker = worker or job.pol.get("worker") or ""
    if expected_worker and expected_worker != m["worker_key"]:
        rep.fail(
            "worker",
            Reason.WORKER_MISMATCH,
            "bundle is signed by another worker than the job names",
        )
        raise _Reject
    steps_expected = job.checkpoint_steps()
    got_steps = [c["step"] for c in m["checkpoints"]]
    if m["interval"] != job.interval or m["steps"] != job.steps or got_steps != steps_expected:
        rep.fail(
            "structure",
            Reason.TRANSCRIPT_MALFORMED,
            "checkpoint steps are not 0, k, 2k, …, steps of the job",
        )
        raise _Reject
    for i, iv in enumerate(m["intervals"]):
        if (iv["start_step"], iv["end_step"]) != (steps_expected[i], steps_expected[i + 1]):
            rep.fail(
                "structure",
                Reason.TRANSCRIPT_MALFORMED,
                f"interval {i} has the wrong step range",
                i,
            )
            raise _Reject
    for ck in m["checkpoints"]:
        if ck["blob"] != blob_name(bytes.fromhex(ck["root"])):
            rep.fail(
                "paths",
                Reason.BAD_PATH,
                f"checkpoint {ck['index']} names blob {ck['blob']!r}; "
                "blobs must be blobs/<root>.safetensors",
            )
            raise _Reject
    rep.passed("job")
    rep.passed("structure")
    rep.passed("paths")

    # 4. data and initial weights ----------------------------------------------------------
    try:
        ds = dataset if dataset is not None else load_dataset(job)
    except FormatError as e:
        _fatal(rep, "data", e, Reason.DATA_MISMATCH)
    droot = ds.root()
    if not digests_equal(droot, man.data_root) or (
        job.data["root"] and job.data["root"] != droot.hex()
    ):
        rep.fail(
            "data", Reason.DATA_MISMATCH, "data root differs between bundle, job and local data"
        )
        raise _Reject
    rep.passed("data")
    try:  # a job whose model or batch size does not fit its own data can have no honest bundle
        check_dims(job, ds)
        sampler = job_sampler(job, len(ds))
    except FormatError as e:
        _fatal(rep, "job", e, Reason.JOB_MALFORMED)
    circ = None
    if job.mode == "zk":  # the verifier's own circuit (SPEC IV); needs the zk extra
        from dk.verifier import zk

        try:
            circ = zk.load_circuit(job)
        except (BackendUnavailable, ImportError) as e:
            rep.fail("zk", Reason.BACKEND_UNAVAILABLE, str(e))
            raise _Reject from None
    init_ck = initial_checkpoint(job, sampler.steps_per_epoch)
    if circ is not None:
        init_ck.update(zk.init_extra(job, circ))
    init_root = checkpoint_root(init_ck)
    if not digests_equal(init_root, bytes.fromhex(m["checkpoints"][0]["root"])) or (
        job.pol["init_root"] and job.pol["init_root"] != init_root.hex()
    ):
        rep.fail("init", Reason.INIT_MISMATCH, "checkpoint 0 is not the job's initial weights")
        raise _Reject
    rep.passed("init")
    if "dp" in job.train:  # ε at δ of the job's DP-SGD steps (SPEC Part VII §4)
        from dk.pol.dp import epsilon

        dp = job.train["dp"]
        rep.figures["dp_delta"] = dp["delta"]
        try:  # None: no noise (ε unbounded) or no Opacus here; the replay does not need it
            eps = epsilon(dp, batch_size=int(job.train["batch_size"]), n=len(ds), steps=job.steps)
            rep.figures["dp_epsilon"] = eps if eps != float("inf") else None
        except BackendUnavailable:
            rep.figures["dp_epsilon"] = None

    # 5. batch commitments ---------------------------------------------------------------------
    for iv in m["intervals"]:
        want = sampler.batch_commitment(iv["index"], iv["start_step"], iv["end_step"])
        if not digests_equal(want, bytes.fromhex(iv["batch_commitment"])):
            rep.fail(
                "batches",
                Reason.BATCH_MISMATCH,
                f"interval {iv['index']} batch commitment is not the job's sampler order",
                iv["index"],
            )
            raise _Reject
    rep.passed("batches")

    # 6. challenge ------------------------------------------------------------------------------
    n_iv = len(m["intervals"])
    if beacon is None:
        beacon, src = os.urandom(32), "verifier-nonce"
    else:
        src = "given"
    rep.beacon = beacon.hex()
    s = samples if samples is not None else samples_for(n_iv, f, detect)
    norms = [float(iv["update_norm"]) for iv in m["intervals"]]
    epochs = [iv["start_step"] // sampler.steps_per_epoch for iv in m["intervals"]]
    chal = derive_challenge(man.transcript_root, beacon, norms, epochs, s, topq)
    rep.challenged = chal
    rep.figures.update(
        {
            "intervals": n_iv,
            "samples": min(s, n_iv),
            "topq": topq,
            "beacon_source": src,
            "skipped_fraction": f,
            "detection_probability": round(detection_probability(n_iv, s, f), 6),
        }
    )

    # 7. blobs against their commitments (every one, or those the challenge needs) ----------------
    tolerant = job.mode == "tolerant"
    needed = set(chal) | ({i + 1 for i in chal} if tolerant or circ is not None else set())
    fetch = (
        set(range(len(m["checkpoints"]))) if integrity == "all" else needed | {i + 1 for i in chal}
    )
    rep.figures["integrity"] = integrity
    rep.figures["checkpoints_checked"] = len(fetch)
    held: dict[int, dict[str, np.ndarray]] = {}
    zk_digests: dict[int, str] = {}
    prev: Mapping[str, np.ndarray] | None = None
    hp = hparam_tensors(job)
    nbytes = 0
    for ck in m["checkpoints"]:
        j, step = ck["index"], ck["step"]
        if j not in fetch:
            prev = None
            continue
        try:
            data = read_blob_file(bundle / ck["blob"])
            nbytes += len(data)
            rep.figures["bytes_read"] = nbytes
            if len(data) != ck["nbytes"]:  # SPEC §11.2: nbytes is the blob's exact size
                raise FormatError(
                    f"checkpoint {j}: blob is {len(data)} bytes, the manifest says {ck['nbytes']}",
                    reason="BLOB_MALFORMED",
                )
            tensors = parse_blob(data)
        except FormatError as e:
            _fatal(rep, "blobs", e, Reason.BLOB_MALFORMED)
        if not digests_equal(checkpoint_root(tensors), bytes.fromhex(ck["root"])):
            rep.fail(
                "blobs",
                Reason.COMMITMENT_MISMATCH,
                f"checkpoint {j} does not hash to its committed root",
            )
            raise _Reject
        try:
            check_schema(job, step, tensors)
        except FormatError as e:
            _fatal(rep, "blobs", e, Reason.SHAPE_MISMATCH)
        e_, p_ = divmod(step, sampler.steps_per_epoch)
        if int(tensors["meta/step"]) != step or tensors["sampler/state"].tolist() != [e_, p_]:
            rep.fail(
                "blobs", Reason.STEP_MISMATCH, f"checkpoint {j} holds the state of another step"
            )
            raise _Reject
        for k, v in hp.items():
            if tensors[k].tobytes() != v.tobytes():
                rep.fail(
                    "hparams", Reason.HPARAM_MISMATCH, f"checkpoint {j}: {k} is not the job's value"
                )
                raise _Reject
        if prev is not None:
            claimed = float(m["intervals"][j - 1]["update_norm"])
            actual = update_norm(prev, tensors)
            if abs(claimed - actual) > NORM_RTOL * max(abs(actual), 1e-30):
                rep.fail(
                    "metadata",
                    Reason.METADATA_MISMATCH,
                    f"interval {j - 1} claims update norm {claimed:.6g}, "
                    f"checkpoints give {actual:.6g}",
                    j - 1,
                )
                raise _Reject
        if circ is not None and (zk_digest := zk.checkpoint_digest(circ, tensors)) is None:
            rep.fail(
                "zk",
                Reason.ZK_INSTANCE_MISMATCH,
                f"checkpoint {j}: zk/params_digest is not the digest of its weights",
            )
            raise _Reject
        if j in needed:
            held[j] = tensors
            if circ is not None:
                zk_digests[j] = zk_digest
        prev = tensors
    rep.figures["bytes_read"] = nbytes
    rep.passed("blobs")
    rep.passed("hparams")
    rep.passed("metadata")

    # 8. replay, or zk proofs instead of replay -----------------------------------------------
    if not replay:
        rep.checks["replay"] = "skip"
        return
    if circ is not None:
        zk.verify_proofs(rep, bundle, circ, m, chal, zk_digests, sampler, ds)
        return
    from dk.verifier.replay import replay_challenged

    replay_challenged(rep, bundle, job, ds, m, chal, held, workers)
