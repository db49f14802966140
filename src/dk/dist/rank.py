"""One rank of a data-parallel run: train, record (rank 0), check and sign (SPEC §8.5, §11.6).

Every rank runs :func:`train_rank` with its own signing key:

1. the ranks all-gather their public keys: the run's ``ext.ranks`` (rank 0's key is the
   bundle's ``worker_key``);
2. each step runs on :class:`dk.pol.parallel.ParallelKernelSession` (shard, all-gather of the
   gradient messages, fixed-order combination); rank 0 records the run with the
   :class:`~dk.pol.recorder.Recorder`, every other rank computes its own checkpoint roots and
   update norms;
3. rank 0 shares its manifest (without signatures); each rank checks it against its own
   roots, norms, batch commitments and rank digests, then signs the transcript root
   (:func:`dk.pol.rank_ext.rank_signing_digest`);
4. the signatures are all-gathered and rank 0 writes ``RUN/rank_signatures.json`` last.

``dk prove`` refuses a data-parallel run without valid rank signatures, so a run whose rank
died (its collective fails after ``timeout``) never yields a bundle.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from dk.crypto.canonical_json import canonical_json, parse_json
from dk.crypto.hashing import digests_equal
from dk.crypto.keys import SigningKey, VerifyKey
from dk.errors import DkError, JobMismatch
from dk.pol.checkpoint import checkpoint_root, update_norm
from dk.pol.data import load_dataset
from dk.pol.job import JobSpec, as_job
from dk.pol.parallel import Fault, Grads, ParallelKernelSession
from dk.pol.rank_ext import (
    RANK_MESSAGES_SUFFIX,
    RANK_SIGNATURES,
    RANK_STEPS_DIR,
    rank_signing_digest,
)
from dk.pol.run import RunInfo, atomic_write, write_run
from dk.pol.sampler import job_sampler

FAULT_ENV = "DK_DP_FAULT"


class RankFailed(DkError):
    """A rank found the shared manifest, or a peer's signature, not its own view of the run."""


class Comm(Protocol):
    """What a rank needs from its group: its place and a rank-ordered all-gather."""

    rank: int
    world_size: int

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's bytes, in rank order."""
        ...


def fault_from_env(rank: int) -> Fault | None:
    """Test seam (``DK_DP_FAULT``): ``stale:R`` makes rank R send its previous step's gradient
    from its second step on (a rank that skips its shard); ``die:R:T`` kills rank R at step T.
    """
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return None
    kind, *args = spec.split(":")
    if int(args[0]) != rank:
        return None
    if kind == "stale":

        def stale(t: int, r: int, fresh: Grads, previous: Grads | None) -> Grads:
            return previous if previous is not None else fresh

        return stale
    if kind == "die":
        at = int(args[1])

        def die(t: int, r: int, fresh: Grads, previous: Grads | None) -> Grads:
            if t >= at:
                os._exit(17)
            return fresh

        return die
    raise ValueError(f"{FAULT_ENV}={spec!r}: expected stale:R or die:R:T")


def make_engine(
    job: JobSpec,
    dataset: Any,
    *,
    rank: int,
    exchange: Any,
    fault: Fault | None,
) -> Any:
    """The rank's step engine: dk's kernels in exact mode, torch in tolerant mode (§8.5)."""
    if job.mode == "tolerant":
        from dk.pol.parallel_torch import ParallelTorchSession

        return ParallelTorchSession(
            job,
            output_dim=getattr(dataset, "output_dim", None),
            rank=rank,
            exchange=exchange,
            fault=fault,
            keep_messages=rank == 0,
        )
    return ParallelKernelSession(job, rank=rank, exchange=exchange, fault=fault)


def _write_rank_steps(run_dir: Path, engine: Any, info: RunInfo) -> None:
    """``RUN/ranks/<i>.bin``: each rank's step digests of interval ``i``, rank-major."""
    out = run_dir / RANK_STEPS_DIR
    out.mkdir(exist_ok=True)
    for iv in info.intervals:
        data = b"".join(d for rank in engine.step_digests(iv.index) for d in rank)
        atomic_write(out / f"{iv.index}.bin", data)


def _write_rank_messages(run_dir: Path, engine: Any, interval: int) -> None:
    """Tolerant mode: ``RUN/ranks/<i>.msg``, the interval's messages, rank-major (§11.6)."""
    out = run_dir / RANK_STEPS_DIR
    out.mkdir(exist_ok=True)
    atomic_write(out / f"{interval}{RANK_MESSAGES_SUFFIX}", engine.messages(interval))
    engine.drop_messages(interval)  # rank 0 holds one interval's messages at a time


def _own_view(job: JobSpec, engine: Any, dataset: Any) -> dict[str, Any]:
    """A rank other than 0: train, computing checkpoint roots and update norms itself."""
    sampler = job_sampler(job, len(dataset))
    spe = sampler.steps_per_epoch
    prev = engine.snapshot(0, spe)
    roots, norms = [checkpoint_root(prev).hex()], []
    ck_steps = job.checkpoint_steps()
    for t in range(job.steps):
        idx = sampler.batch(t)
        engine.step(dataset.X[idx], dataset.y[idx])
        if t + 1 in ck_steps:
            ck = engine.snapshot(t + 1, spe)
            roots.append(checkpoint_root(ck).hex())
            norms.append(update_norm(prev, ck))
            prev = ck
    return {"roots": roots, "norms": norms}


def _check_manifest(
    m: dict[str, Any],
    job: JobSpec,
    engine: Any,
    view: dict[str, Any] | None,
    ranks: list[dict[str, Any]],
    data_root: str,
) -> bytes:
    """A rank's checks of rank 0's manifest before signing; returns the transcript root."""
    from dk.pol.transcript import parse_manifest, transcript_root

    man = parse_manifest(canonical_json(m))
    if man.job_id != job.job_id or man.data_root.hex() != data_root:
        raise RankFailed("rank 0's manifest is for another job or data")
    if (man.ext or {}).get("ranks") != ranks or man.worker_key.hex() != ranks[0]["worker_key"]:
        raise RankFailed("rank 0's manifest names other ranks")
    for iv in man.interval_entries:
        if (iv.ext or {}).get("rank_digests") != engine.rank_digests(iv.index):
            raise RankFailed(f"rank 0's manifest: interval {iv.index} has other rank digests")
    if view is not None:
        if [c.root.hex() for c in man.checkpoint_entries] != view["roots"]:
            raise RankFailed("rank 0's checkpoints are not this rank's")
        if [iv.update_norm for iv in man.interval_entries] != view["norms"]:
            raise RankFailed("rank 0's update norms are not this rank's")
    root = transcript_root(m)
    if not digests_equal(root, man.transcript_root):
        raise RankFailed("rank 0's manifest has a wrong transcript root")
    return root


def train_rank(
    job: JobSpec | str | Path,
    run_dir: str | Path | None,
    *,
    comm: Comm,
    key: SigningKey,
    progress: Any = None,
    fault: Fault | None = None,
) -> RunInfo | None:
    """Train ``job`` as rank ``comm.rank`` of ``comm.world_size`` (see the module docs).

    Args:
        job: the job (``train.world_size`` must equal ``comm.world_size``).
        run_dir: the run directory rank 0 writes (ignored on other ranks).
        comm: the group (:class:`dk.dist.comm.TorchComm`).
        key: this rank's signing key.
        progress: optional ``callable(step)`` (rank 0).
        fault: test seam (default: ``DK_DP_FAULT``, :func:`fault_from_env`).

    Returns:
        Rank 0: the run's summary; other ranks: ``None``.

    Raises:
        JobMismatch: the group's size is not the job's ``world_size``.
        RankFailed: a rank's checks of the shared manifest or of a signature failed.
    """
    from dk.pol.recorder import Recorder
    from dk.prover.bundle import build_manifest

    job = as_job(job)
    rank, world = comm.rank, comm.world_size
    if world != job.world_size or world < 2:
        raise JobMismatch(
            f"the group has {world} ranks, the job's train.world_size is {job.world_size}"
        )
    keys = comm.all_gather_bytes(key.verify_key.raw)
    ranks: list[dict[str, Any]] = [{"rank": r, "worker_key": k.hex()} for r, k in enumerate(keys)]
    dataset = load_dataset(job)
    engine = make_engine(
        job,
        dataset,
        rank=rank,
        exchange=comm.all_gather_bytes,
        fault=fault or fault_from_env(rank),
    )
    tolerant = job.mode == "tolerant"
    info: RunInfo | None = None
    view: dict[str, Any] | None = None
    if rank == 0:
        if run_dir is None:
            raise ValueError("rank 0 needs a run directory")
        out = Path(run_dir)
        rec = Recorder(job, out, dataset=dataset, engine=engine, progress=progress)
        rec.info.ext = {**(rec.info.ext or {}), "ranks": ranks}
        rec.start_engine()
        ck_steps = job.checkpoint_steps()
        for t in range(job.steps):
            rec.engine_step()
            if tolerant and t + 1 in ck_steps:  # each interval's messages, then drop them
                _write_rank_messages(out, engine, t // job.interval)
        info = rec.finish()
        for iv in info.intervals:
            iv.ext = {**(iv.ext or {}), "rank_digests": engine.rank_digests(iv.index)}
        _write_rank_steps(out, engine, info)
        write_run(out, info)
        payload = canonical_json(build_manifest(info, keys[0]))
    else:
        view = _own_view(job, engine, dataset)
        payload = b""
    shared = comm.all_gather_bytes(payload)[0]
    m = parse_json(shared, limit=len(shared), what="rank 0's manifest")
    root = _check_manifest(m, job, engine, view, ranks, dataset.root().hex())
    sig = key.sign(rank_signing_digest(job.job_id, root, rank, key.verify_key.raw))
    sigs = comm.all_gather_bytes(sig)
    for r, (s, k) in enumerate(zip(sigs, keys, strict=True)):
        if not VerifyKey(k).verify(s, rank_signing_digest(job.job_id, root, r, k)):
            raise RankFailed(f"rank {r}'s signature does not verify")
    if rank == 0:
        assert run_dir is not None
        doc = {"transcript_root": root.hex(), "rank_signatures": [s.hex() for s in sigs]}
        atomic_write(Path(run_dir) / RANK_SIGNATURES, json.dumps(doc, indent=1).encode())
    return info


__all__ = ["Comm", "RankFailed", "fault_from_env", "train_rank"]
