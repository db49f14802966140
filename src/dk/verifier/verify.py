"""``verify_bundle``: the verifier's whole procedure (SPEC §12), total by construction.

The procedure is the list :data:`CHECKS`, in the normative order of SPEC §12.2: each check is a
small function over one shared :class:`Context`, named after its SPEC step. A check records a
pass or a :class:`~dk.verifier.report.Finding`; a fatal finding stops the list, so the first
reason code of a report (which the report digest covers) is fixed by that order.

Malformed input never raises: every failure becomes a finding with a reason code in the
returned :class:`Report`. The verifier imports only ``dk.crypto`` and ``dk.pol``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from dk.crypto.canonical_json import encode_parsed
from dk.crypto.hashing import digests_equal, parse_hex_digest
from dk.crypto.keys import VerifyKey
from dk.errors import BackendUnavailable, FormatError
from dk.pol.checkpoint import (
    blob_name,
    check_schema,
    check_step_state,
    checkpoint_root,
    initial_checkpoint,
    read_blob_file,
    update_norm,
)
from dk.pol.data import Dataset, check_dims, load_dataset
from dk.pol.job import JobSpec, as_job
from dk.pol.sampler import job_sampler
from dk.pol.transcript import (
    MAX_MANIFEST_BYTES,
    Manifest,
    ManifestCheckpoint,
    parse_manifest,
    signing_digest,
    transcript_root,
)
from dk.verifier.blame import check_ranks
from dk.verifier.challenge import derive_challenge, detection_probability, samples_for
from dk.verifier.files import parse_checkpoint, read_bounded
from dk.verifier.loss import check_loss_present
from dk.verifier.report import Reason, Report
from dk.verifier.rounding import check_rounding_claims, check_rounding_logs

MAX_SIGNATURE_FILE = 256
NORM_RTOL = 1e-9
INTEGRITY = ("all", "challenged")

Tensors = dict[str, np.ndarray]


class Stop(Exception):
    """Internal: stop verification after a fatal finding (already recorded)."""


@dataclass(frozen=True)
class Options:
    """What the caller of :func:`verify_bundle` fixed (see its arguments)."""

    beacon: bytes | None = None
    root: bytes | None = None
    samples: int | None = None
    topq: int = 1
    workers: int = 1
    skipped_fraction: float = 0.1
    detect: float = 0.99
    worker: str | None = None
    dataset: Dataset | None = None
    data: Path | None = None
    integrity: str = "challenged"
    replay: bool = True
    executor: Any = None
    tolerance: float | None = None
    device: str | None = None


@dataclass
class Context:
    """What the checks share: inputs, and what earlier checks established."""

    rep: Report
    bundle: Path
    job_in: Any
    opts: Options
    job: JobSpec = field(init=False)
    man: Manifest = field(init=False)
    ds: Dataset = field(init=False)
    sampler: Any = field(init=False)
    circ: Any = None
    beacon: bytes = b""
    chal: list[int] = field(default_factory=list)
    held: dict[int, Tensors] = field(default_factory=dict)
    zk_digests: dict[int, str] = field(default_factory=dict)
    logs: dict[int, bytes] = field(default_factory=dict)  # SPEC VI: challenged intervals' logs

    def fail(self, check: str, code: Reason, message: str, interval: int | None = None) -> NoReturn:
        """Record a fatal finding and stop."""
        self.rep.fail(check, code, message, interval)
        raise Stop

    def fatal(self, check: str, e: FormatError, default: Reason) -> NoReturn:
        """Record a ``FormatError`` as a fatal finding (its own code when it names one)."""
        code = Reason(e.reason) if e.reason in Reason.__members__ else default
        self.fail(check, code, str(e))


# -- §12.2 steps 1-8: inputs, manifest, root, signature, job, ranks, structure, paths ----------


def check_inputs(ctx: Context) -> None:
    """The bundle directory exists and the job parses (the verifier's own inputs)."""
    if not ctx.bundle.is_dir():
        ctx.fail("bundle", Reason.BUNDLE_NOT_FOUND, f"bundle directory not found: {ctx.bundle}")
    try:
        job = as_job(ctx.job_in)
        if ctx.opts.data is not None:  # the verifier's own copy of the data (not hashed)
            job = job.with_updates(data={"path": str(Path(ctx.opts.data).resolve())})
    except FormatError as e:
        ctx.fatal("job", e, Reason.JOB_MALFORMED)
    ctx.job = job
    ctx.rep.mode = job.mode


def check_manifest(ctx: Context) -> None:
    """§11.2: bounded read, strict parse, canonical bytes."""
    try:
        raw = read_bounded(
            ctx.bundle / "manifest.json",
            MAX_MANIFEST_BYTES,
            Reason.MANIFEST_MISSING,
            Reason.MANIFEST_TOO_LARGE,
        )
        man = parse_manifest(raw)
    except FormatError as e:
        ctx.fatal("manifest", e, Reason.MANIFEST_MALFORMED)
    if raw != encode_parsed(man.raw):  # = man.to_bytes(), the parse having checked the values
        ctx.fail("manifest", Reason.MANIFEST_MALFORMED, "manifest.json is not canonical JSON")
    ctx.man = man
    ctx.rep.job_id, ctx.rep.worker_key, ctx.rep.transcript_root = (
        man.job_id.hex(),
        man.worker_key.hex(),
        man.transcript_root.hex(),
    )
    ctx.rep.passed("manifest")


def check_transcript_root(ctx: Context) -> None:
    """§11.1: the transcript root is recomputed from the manifest's entries."""
    computed = transcript_root(ctx.man.raw, ctx.man.ext_digests)
    if not digests_equal(computed, ctx.man.transcript_root):
        ctx.fail(
            "transcript_root",
            Reason.TRANSCRIPT_ROOT_MISMATCH,
            "transcript_root does not match the manifest's entries",
        )
    ctx.rep.passed("transcript_root")


def check_signature(ctx: Context) -> None:
    """§11.3-§11.4: ``signature.hex`` is 128 lowercase hex characters and verifies."""
    try:
        raw = read_bounded(
            ctx.bundle / "signature.hex",
            MAX_SIGNATURE_FILE,
            Reason.SIGNATURE_MISSING,
            Reason.SIGNATURE_INVALID,
        )
    except FormatError as e:
        ctx.fatal("signature", e, Reason.SIGNATURE_INVALID)
    text = raw[:-1] if raw.endswith(b"\n") else raw
    try:
        sig = parse_hex_digest(text.decode("ascii"), what="signature.hex", nbytes=64)
    except (FormatError, UnicodeDecodeError):
        ctx.fail(
            "signature",
            Reason.SIGNATURE_INVALID,
            "signature.hex must be 128 lowercase hex characters",
        )
    man = ctx.man
    digest = signing_digest(man.job_id, man.transcript_root, man.worker_key)
    if not VerifyKey(man.worker_key).verify(sig, digest):
        ctx.fail("signature", Reason.SIGNATURE_INVALID, "Ed25519 signature does not verify")
    ctx.rep.passed("signature")


def check_job_binding(ctx: Context) -> None:
    """§12.2: the bundle is for this job (``job_id``) and signed by the named worker."""
    if not digests_equal(ctx.man.job_id, ctx.job.job_id):
        ctx.fail("job", Reason.JOB_MISMATCH, "bundle is for a different job (job_id differs)")
    expected = ctx.opts.worker or ctx.job.pol.get("worker") or ""
    if expected and expected != ctx.man.worker_key.hex():
        ctx.fail(
            "worker",
            Reason.WORKER_MISMATCH,
            "bundle is signed by another worker than the job names",
        )
    if ctx.opts.tolerance is not None and ctx.job.mode == "tolerant":  # a market's profiled one
        ctx.job = ctx.job.with_updates(pol={"tolerance": ctx.opts.tolerance})
    ctx.rep.passed("job")


def check_challenged_root(ctx: Context) -> None:
    """§12.1: a challenge pins the root committed before the beacon; any other root is a
    re-commitment after the beacon (``ROOT_NOT_CHALLENGED``)."""
    pinned = ctx.opts.root
    if pinned is None:
        return
    ctx.rep.challenged_root = pinned.hex()
    if not digests_equal(pinned, ctx.man.transcript_root):
        ctx.fail(
            "challenge",
            Reason.ROOT_NOT_CHALLENGED,
            f"bundle's transcript root {ctx.man.transcript_root.hex()[:16]}… is not the "
            f"challenged root {pinned.hex()[:16]}…",
        )
    ctx.rep.passed("challenge")


def check_structure(ctx: Context) -> None:
    """§11.1: checkpoint steps are ``0, k, …, steps`` and intervals span them."""
    m, job = ctx.man.raw, ctx.job
    steps = job.checkpoint_steps()
    got = [c.step for c in ctx.man.checkpoint_entries]
    if m["interval"] != job.interval or m["steps"] != job.steps or got != steps:
        ctx.fail(
            "structure",
            Reason.TRANSCRIPT_MALFORMED,
            "checkpoint steps are not 0, k, 2k, …, steps of the job",
        )
    for i, iv in enumerate(ctx.man.interval_entries):
        if (iv.start_step, iv.end_step) != (steps[i], steps[i + 1]):
            ctx.fail(
                "structure",
                Reason.TRANSCRIPT_MALFORMED,
                f"interval {i} has the wrong step range",
                i,
            )
    check_loss_present(ctx)  # SPEC §11.7: the committed training losses are there
    ctx.rep.passed("structure")


def check_paths(ctx: Context) -> None:
    """§11.2: every blob is named ``blobs/<root>.safetensors``."""
    for ck in ctx.man.checkpoint_entries:
        if ck.blob != blob_name(ck.root):
            ctx.fail(
                "paths",
                Reason.BAD_PATH,
                f"checkpoint {ck.index} names blob {ck.blob!r}; "
                "blobs must be blobs/<root>.safetensors",
            )
    ctx.rep.passed("paths")


# -- §12.2 steps 10-11: data and checkpoint 0 (step 9: verifier.rounding) ----------------------


def check_data(ctx: Context) -> None:
    """§7: the bundle's data root is the job's; the verifier holds that data.

    The worker's side comes first: a bundle whose data root differs from the root the job pins
    is ``DATA_MISMATCH`` whatever the verifier holds. The verifier's side: data it cannot load
    or whose root is not the job's is ``DATA_UNAVAILABLE`` (or ``DECODER_MISMATCH``), which
    makes the report inconclusive. A job that pins no root lets the verifier's data stand for
    it; a difference is then inconclusive too (nobody can say whose copy is right).
    """
    job, man = ctx.job, ctx.man
    pinned = job.data.get("root", "")
    if pinned and pinned != man.data_root.hex():
        ctx.fail("data", Reason.DATA_MISMATCH, "the bundle's data root is not the job's")
    try:
        ds = ctx.opts.dataset if ctx.opts.dataset is not None else load_dataset(job)
    except FormatError as e:
        code = Reason.DECODER_MISMATCH if e.reason == "DECODER_MISMATCH" else None
        ctx.fail("data", code or Reason.DATA_UNAVAILABLE, f"the verifier's data: {e}")
    droot = ds.root()
    if not digests_equal(droot, man.data_root):
        ctx.fail(
            "data",
            Reason.DATA_UNAVAILABLE,
            "the verifier's copy of the data has another root than the "
            + ("job's" if pinned else "bundle's (the job pins none)"),
        )
    ctx.ds = ds
    ctx.rep.passed("data")


def check_init(ctx: Context) -> None:
    """§10.2: checkpoint 0 is the job's initial weights (zk: with the circuit's digest)."""
    job = ctx.job
    try:  # a job whose model or batch size does not fit its own data can have no honest bundle
        check_dims(job, ctx.ds)
        # challenged: a few intervals' batches of many epochs; all: every batch of every epoch
        ctx.sampler = job_sampler(job, len(ctx.ds), sparse=ctx.opts.integrity == "challenged")
    except FormatError as e:
        ctx.fatal("job", e, Reason.JOB_MALFORMED)
    if job.mode == "zk":  # the verifier's own circuit (SPEC IV); needs the zk extra
        from dk.verifier import zk

        try:
            ctx.circ = zk.load_circuit(job)
        except (BackendUnavailable, ImportError) as e:
            ctx.fail("zk", Reason.BACKEND_UNAVAILABLE, str(e))
        except FormatError as e:
            ctx.fatal("zk", e, Reason.ZK_SRS_UNAVAILABLE)
        ctx.rep.srs = {"sha256": ctx.circ.srs.sha256, "kind": ctx.circ.srs.kind}
    try:  # the verifier's own copy of an init.safetensors: missing or not init.root
        init_ck = initial_checkpoint(job, ctx.sampler.steps_per_epoch)
    except FormatError as e:
        ctx.fail("init", Reason.INIT_UNAVAILABLE, f"the verifier's initial weights: {e}")
    if ctx.circ is not None:
        from dk.verifier import zk

        init_ck.update(zk.init_extra(job, ctx.circ))
    init_root = checkpoint_root(init_ck)
    if not digests_equal(init_root, ctx.man.checkpoint_entries[0].root) or (
        job.pol["init_root"] and job.pol["init_root"] != init_root.hex()
    ):
        ctx.fail("init", Reason.INIT_MISMATCH, "checkpoint 0 is not the job's initial weights")
    ctx.rep.passed("init")


# -- §12.2 step 12: the challenge --------------------------------------------------------------


def challenge(ctx: Context) -> None:
    """§12.1: derive the challenged intervals from the root and the beacon."""
    rep, opts, ivs = ctx.rep, ctx.opts, ctx.man.interval_entries
    n = len(ivs)
    beacon, src = (opts.beacon, "given") if opts.beacon is not None else (os.urandom(32), "nonce")
    ctx.beacon = beacon
    s = (
        opts.samples
        if opts.samples is not None
        else samples_for(n, opts.skipped_fraction, opts.detect)
    )
    norms = [iv.update_norm for iv in ivs]
    epochs = [iv.start_step // ctx.sampler.steps_per_epoch for iv in ivs]
    ctx.chal = derive_challenge(ctx.man.transcript_root, beacon, norms, epochs, s, opts.topq)
    rep.figures.update(
        {
            "intervals": n,
            "samples": min(s, n),
            "topq": opts.topq,
            "beacon_source": "verifier-nonce" if src == "nonce" else "given",
            "skipped_fraction": opts.skipped_fraction,
            "detection_probability": round(detection_probability(n, s, opts.skipped_fraction), 6),
        }
    )


# -- §12.2 step 13: batch commitments ----------------------------------------------------------


def check_batches(ctx: Context) -> None:
    """§8.2: the batch commitments of the integrity mode are the job's sampler order.

    ``all`` checks every interval's; ``challenged`` checks the challenged intervals' only: a
    replay draws its batches from the job's sampler, never from the commitment, so another
    interval's commitment is evidence nothing depends on (SPEC §12.2, integrity modes).
    """
    ivs = ctx.man.interval_entries
    which = range(len(ivs)) if ctx.opts.integrity == "all" else ctx.chal
    ctx.rep.figures["batches_checked"] = len(which)
    for i in which:
        iv = ivs[i]
        want = ctx.sampler.batch_commitment(iv.index, iv.start_step, iv.end_step)
        if not digests_equal(want, iv.batch_commitment):
            ctx.fail(
                "batches",
                Reason.BATCH_MISMATCH,
                f"interval {iv.index} batch commitment is not the job's sampler order",
                iv.index,
            )
    # SPEC §12.2 steps 12-13: the report names the beacon and the challenge from here on
    ctx.rep.beacon, ctx.rep.challenged = ctx.beacon.hex(), ctx.chal
    ctx.rep.passed("batches")


# -- §12.2 step 14: blobs against their commitments --------------------------------------------


def fetched_checkpoints(ctx: Context) -> tuple[set[int], set[int]]:
    """(checkpoints to fetch and check, checkpoints whose tensors later steps need).

    ``challenged`` integrity fetches both ends of every challenged interval: the start to
    replay from, the end to check the claimed update norm (and, in tolerant and zk mode, to
    judge the replay). ``all`` fetches every checkpoint (archival audits).
    """
    chal = ctx.chal
    ends = {i + 1 for i in chal}
    needed = set(chal) | (ends if ctx.job.mode == "tolerant" or ctx.circ is not None else set())
    if ctx.opts.integrity == "all":
        return set(range(len(ctx.man.checkpoint_entries))), needed
    return set(chal) | ends, needed


def check_blob(ctx: Context, ck: ManifestCheckpoint, prev: Tensors | None) -> Tensors:
    """§10.1-§10.3, §11.1: one checkpoint against its commitment, schema, step, hyperparameters
    and (when its predecessor was fetched too) the claimed update norm of the interval."""
    j, step = ck.index, ck.step
    try:
        data = read_blob_file(ctx.bundle / ck.blob)
        ctx.rep.figures["bytes_read"] = ctx.rep.figures.get("bytes_read", 0) + len(data)
        if len(data) != ck.nbytes:  # SPEC §11.2: nbytes is the blob's exact size
            raise FormatError(
                f"checkpoint {j}: blob is {len(data)} bytes, the manifest says {ck.nbytes}",
                reason="BLOB_MALFORMED",
            )
        tensors = parse_checkpoint(data)
    except FormatError as e:
        ctx.fatal("blobs", e, Reason.BLOB_MALFORMED)
    if not digests_equal(checkpoint_root(tensors), ck.root):  # parse_blob: §4-hashable
        ctx.fail(
            "blobs",
            Reason.COMMITMENT_MISMATCH,
            f"checkpoint {j} does not hash to its committed root",
        )
    try:
        check_schema(ctx.job, step, tensors)
    except FormatError as e:
        ctx.fatal("blobs", e, Reason.SHAPE_MISMATCH)
    try:
        check_step_state(ctx.job, step, tensors, ctx.sampler.steps_per_epoch)
    except FormatError as e:
        check = "hparams" if e.reason == "HPARAM_MISMATCH" else "blobs"
        ctx.fatal(check, FormatError(f"checkpoint {j}: {e}", reason=e.reason), Reason.STEP_MISMATCH)
    if prev is not None:
        claimed = ctx.man.interval_entries[j - 1].update_norm
        actual = update_norm(prev, tensors)
        if abs(claimed - actual) > NORM_RTOL * max(abs(actual), 1e-30):
            ctx.fail(
                "metadata",
                Reason.METADATA_MISMATCH,
                f"interval {j - 1} claims update norm {claimed:.6g}, checkpoints give {actual:.6g}",
                j - 1,
            )
    if ctx.circ is not None:
        from dk.verifier import zk

        digest = zk.checkpoint_digest(ctx.circ, tensors)
        if digest is None:
            ctx.fail(
                "zk",
                Reason.ZK_INSTANCE_MISMATCH,
                f"checkpoint {j}: zk/params_digest is not the digest of its weights (or its "
                "weights are outside the quantisation range)",
            )
        ctx.zk_digests[j] = digest
    return tensors


def check_blobs(ctx: Context) -> None:
    """§12.2 step 14: fetch and check the checkpoints the integrity mode names."""
    fetch, needed = fetched_checkpoints(ctx)
    ctx.rep.figures.update(
        integrity=ctx.opts.integrity, checkpoints_checked=len(fetch), bytes_read=0
    )
    if ctx.job.mode == "exact" and ctx.job.pol["backend"] == "torch":  # SPEC §12.3
        ctx.rep.flags.append("same-machine-only")
    prev: Tensors | None = None
    for ck in ctx.man.checkpoint_entries:
        j = ck.index
        if j not in fetch:
            prev = None
            continue
        tensors = check_blob(ctx, ck, prev)
        if j in needed:
            ctx.held[j] = tensors
        prev = tensors
    for name in ("blobs", "hparams", "metadata"):
        ctx.rep.passed(name)


# -- §12.2 steps 15-16: rounding logs, replay, or zk proofs instead of replay -------------------


def check_replay(ctx: Context) -> None:
    """§12.3 (or Part IV §9.5 in zk mode): judge every challenged interval."""
    if not ctx.opts.replay:
        ctx.rep.checks["replay"] = "skip"
        return
    if ctx.circ is not None:
        from dk.verifier import zk

        zk.verify_proofs(
            ctx.rep,
            ctx.bundle,
            ctx.circ,
            ctx.job,
            ctx.man.raw,
            ctx.chal,
            ctx.zk_digests,
            ctx.sampler,
            ctx.ds,
        )
        return
    from dk.verifier.replay import replay_challenged

    try:
        results = replay_challenged(
            ctx.rep,
            ctx.job,
            ctx.ds,
            ctx.man,
            ctx.chal,
            ctx.held,
            ctx.opts.workers,
            ctx.opts.executor,
            logs=ctx.logs,
            device=ctx.opts.device,
        )
    except BackendUnavailable as e:  # e.g. --device cuda without CUDA: the verifier's trouble
        ctx.fail("replay", Reason.BACKEND_UNAVAILABLE, str(e))
    if ctx.job.world_size > 1 and results:  # SPEC §12.6: blame by rank
        from dk.verifier.blame import judge_ranks

        judge_ranks(
            ctx.rep,
            ctx.bundle,
            ctx.man,
            ctx.chal,
            results,
            job=ctx.job,
            dataset=ctx.ds,
            held=ctx.held,
        )


#: SPEC §12.2, in its normative order: the first failing check gives the first reason code.
CHECKS: tuple[Callable[[Context], None], ...] = (
    check_inputs,
    check_manifest,
    check_transcript_root,
    check_signature,
    check_job_binding,
    check_ranks,
    check_challenged_root,
    check_structure,
    check_paths,
    check_rounding_claims,
    check_data,
    check_init,
    challenge,
    check_batches,
    check_blobs,
    check_rounding_logs,
    check_replay,
)


def _dp_figures(ctx: Context) -> None:
    """ε at δ of a DP-SGD job's steps (SPEC Part VII §4); figures only, not in the digest."""
    job, ds = getattr(ctx, "job", None), getattr(ctx, "ds", None)
    if job is None or ds is None or "dp" not in job.train:
        return
    dp = job.train["dp"]
    ctx.rep.figures["dp_delta"] = dp["delta"]
    try:
        from dk.pol.dp import epsilon

        eps = epsilon(dp, batch_size=int(job.train["batch_size"]), n=len(ds), steps=job.steps)
        ctx.rep.figures["dp_epsilon"] = eps if eps != float("inf") else None
    except Exception:  # Opacus missing or failing: the figure is unknown, not the verdict
        ctx.rep.figures["dp_epsilon"] = None


def verify_bundle(
    bundle: str | os.PathLike[str],
    job: JobSpec | str | os.PathLike[str],
    *,
    beacon: bytes | None = None,
    root: bytes | None = None,
    samples: int | None = None,
    topq: int = 1,
    workers: int = 1,
    skipped_fraction: float = 0.1,
    detect: float = 0.99,
    worker: str | None = None,
    dataset: Dataset | None = None,
    data: str | os.PathLike[str] | None = None,
    integrity: str = "challenged",
    replay: bool = True,
    executor: Any = None,
    tolerance: float | None = None,
    device: str | None = None,
) -> Report:
    """Verify a bundle against a job; never raises on bad input.

    Args:
        bundle: the bundle directory.
        job: the job (or path to ``job.toml``) the consumer published.
        beacon: entropy fixed after the worker committed (a verifier nonce, or the market's
            beacon from its drawn validators, SPEC V §5.1). ``None`` draws a fresh 32-byte
            nonce from the OS.
        root: the transcript root the challenge was issued for (``dk challenge`` records it);
            a bundle with another root is rejected with ``ROOT_NOT_CHALLENGED`` (SPEC §12.1).
        samples: uniform interval samples ``s``; ``None`` picks the smallest ``s`` that detects
            a worker who skipped ``skipped_fraction`` of the intervals with probability
            ``detect``.
        topq: intervals with the largest claimed update per epoch, added to the sample.
        workers: local processes replaying in parallel.
        skipped_fraction: the skipped fraction the detection figure is reported for.
        detect: target detection probability when ``samples`` is ``None``.
        worker: hex public key the bundle must be signed by (default: the job's
            ``pol.worker``, if set).
        dataset: the verifier's copy of the data, loaded (default: load what the job names).
        data: the path of the verifier's copy of the data (replaces the job's ``data.path``,
            which is not hashed).
        integrity: ``"challenged"`` (default) fetches and checks only the checkpoints the
            challenge needs, as a verifier of a remote bundle would (DESIGN §4); ``"all"``
            checks every blob (archival audits). The report says which was done.
        replay: False stops after deriving the challenge and checking integrity (what
            ``dk challenge`` does); the report's ``replay`` check is then ``"skip"``.
        executor: where the replays run instead of ``workers`` local processes, e.g.
            :class:`dk.verifier.executors.RayExecutor` (SPEC §12.5). The report is the same.
        tolerance: tolerant mode: judge replays at this threshold instead of the job's
            ``pol.tolerance`` (a market order's tolerance fixed from validators' profiles,
            SPEC V §12); the job binding is checked first, against the job as given.
        device: where local replays run (``"cpu"``, ``"cuda"``); default: the job's
            ``train.device`` where this machine has it, else the CPU (SPEC §12.3). A rounded
            float32 job (SPEC VI) replays bit for bit on either; a rounded bf16 or exact
            ``torch``-backend job off its own device type is ``BACKEND_UNAVAILABLE``
            (inconclusive); a tolerant job's tolerance was calibrated for its own device. Not
            used by ``executor``, which places replays itself.

    Returns:
        The :class:`Report`: ``report.verdict`` is ``accept``, ``reject`` or ``inconclusive``.
    """
    rep = Report()
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    if integrity not in INTEGRITY:
        raise ValueError("integrity must be 'all' or 'challenged'")
    opts = Options(
        beacon=beacon,
        root=root,
        samples=samples,
        topq=topq,
        workers=workers,
        skipped_fraction=skipped_fraction,
        detect=detect,
        worker=worker,
        dataset=dataset,
        data=Path(data) if data is not None else None,
        integrity=integrity,
        replay=replay,
        executor=executor,
        tolerance=tolerance,
        device=device,
    )
    ctx = Context(rep, Path(bundle), job, opts)
    try:
        for check in CHECKS:
            check(ctx)
    except Stop:
        pass
    except Exception as e:  # totality: a bug or an unforeseen input still yields a report
        rep.fail("internal", Reason.INTERNAL_ERROR, f"{type(e).__name__}: {e}")
    _dp_figures(ctx)
    rep.figures["verify_wall_s"] = round(time.perf_counter() - t_wall, 4)
    rep.figures["verify_cpu_s"] = round(
        time.process_time() - t_cpu + rep.figures.get("replay_cpu_s_workers", 0.0), 4
    )
    return rep
