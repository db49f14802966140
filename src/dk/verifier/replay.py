"""Replaying challenged intervals (SPEC §12.3), locally or over worker processes, and the
market's dispute primitive :func:`replay_interval`.

Worker processes get everything they need from the caller: the job, the caller's dataset and
the start (and, in tolerant mode, end) tensors that the integrity check already verified, so a
worker never reads a bundle file and there is no cache shared between jobs or datasets.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dk.crypto.hashing import digests_equal
from dk.errors import BackendUnavailable, FormatError
from dk.pol.checkpoint import (
    blob_name,
    check_schema,
    check_step_state,
    checkpoint_root,
    read_blob_file,
)
from dk.pol.data import Dataset, load_dataset
from dk.pol.job import JobSpec, as_job
from dk.pol.sampler import job_sampler
from dk.pol.transcript import MAX_MANIFEST_BYTES, Manifest, ManifestCheckpoint, parse_manifest
from dk.verifier.files import parse_checkpoint, read_bounded
from dk.verifier.report import ACCEPT, REJECT, Reason, Report, outcome_of

Tensors = dict[str, np.ndarray]

_replayer: Any = None  # one per worker process of one pool (set by _init_worker)
_START_TIMEOUT_S = 300.0  # every worker of a pool is up by then, or the pool fails


def _init_worker(
    spec: dict[str, Any], base_dir: str, dataset: Dataset, started: Any, device: str | None
) -> None:
    """Pool initializer: the job and the caller's dataset, once per worker process; then wait
    until every worker is up (``started``, a barrier), so that the first one up does not take
    every task of a short replay while the others start: ``workers = N`` replays in N
    processes."""
    from dk.pol.replay import make_replayer

    global _replayer
    _replayer = make_replayer(JobSpec(spec, Path(base_dir)), dataset, device)
    started.wait(_START_TIMEOUT_S)  # a worker that never starts breaks it: the pool fails


def _replay_task(
    start: Tensors,
    claimed: Tensors | None,
    claimed_root: bytes,
    start_step: int,
    end_step: int,
    log: bytes | None = None,
) -> tuple[bool, dict[str, Any], float, int]:
    """Worker-process entry: replay one interval from tensors the parent already verified."""
    from dk.pol.replay import replay_matches

    t0 = time.process_time()
    ok, fig = replay_matches(_replayer, start, claimed, claimed_root, start_step, end_step, log)
    return ok, fig, time.process_time() - t0, os.getpid()


def _task(
    i: int, held: dict[int, Tensors], cks: Any, ivs: Any, logs: dict[int, bytes] | None = None
) -> tuple[Tensors, Tensors | None, bytes, int, int, bytes | None]:
    """Interval ``i``'s replay inputs: verified start (and end) tensors, committed end root,
    step range, and (rounded backend, SPEC VI) its checked rounding log."""
    log = (logs or {}).get(i)
    return held[i], held.get(i + 1), cks[i + 1].root, ivs[i].start_step, ivs[i].end_step, log


def _replay_parallel(
    job: JobSpec,
    ds: Dataset,
    man: Manifest,
    chal: list[int],
    held: dict[int, Tensors],
    workers: int,
    logs: dict[int, bytes] | None = None,
    device: str | None = None,
) -> tuple[dict[int, tuple[bool, dict[str, Any]]], float, int]:
    """Replay the challenged intervals over ``workers`` spawned processes (a replay that raised:
    :func:`_guarded`)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor  # lazy: 0.1 s of imports

    cks, ivs = man.checkpoint_entries, man.interval_entries
    if device is not None or job.pol.get("backend") in ("rounded", "torch"):
        from dk.pol.torch_adapter import replay_device

        replay_device(job, device)  # a device this verifier lacks: raised here, not in a worker
    results: dict[int, tuple[bool, dict[str, Any]]] = {}
    cpu = 0.0
    pids: set[int] = set()
    n, ctx = min(workers, len(chal)), mp.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=n,
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(job.spec, str(job.base_dir), ds, ctx.Barrier(n), device),
    ) as pool:
        futs = {i: pool.submit(_replay_task, *_task(i, held, cks, ivs, logs)) for i in chal}
        for i, fut in futs.items():
            out = _guarded(fut.result)
            results[i] = out[:2]
            if len(out) == 4:
                cpu += out[2]
                pids.add(out[3])
    return results, cpu, len(pids)


def _guarded(run: Any) -> Any:
    """``run()``, or ``(False, {ERROR_KEY: what it raised})`` when one interval's replay raised
    (the verifier's own trouble: recorded as that interval's ``INTERNAL_ERROR``, the others
    still judged, as an executor reports a task that raised); ``BackendUnavailable`` (the
    replay cannot run here at all) propagates."""
    from dk.verifier.executors import ERROR_KEY

    try:
        return run()
    except BackendUnavailable:
        raise
    except Exception as e:
        return False, {ERROR_KEY: f"{type(e).__name__}: {e}"}


def replay_challenged(
    rep: Report,
    job: JobSpec,
    ds: Dataset,
    man: Manifest,
    chal: list[int],
    held: dict[int, Tensors],
    workers: int,
    executor: Any = None,
    *,
    logs: dict[int, bytes] | None = None,
    device: str | None = None,
) -> dict[int, tuple[bool, dict[str, Any]]]:
    """Replay every challenged interval (SPEC §12.3) and record one finding per mismatch;
    returns each interval's ``(ok, figures)`` (empty when the executor failed).

    ``executor`` (e.g. :class:`dk.verifier.executors.RayExecutor`) runs the replays elsewhere;
    if it fails past its retries the report is inconclusive (``EXECUTOR_FAILED``). ``device``:
    where local replays run (default: the job's device where this machine has it, else the CPU).
    """
    from dk.pol.replay import make_replayer, replay_matches
    from dk.verifier.executors import ERROR_KEY, ExecutorFailed

    t0 = time.perf_counter()
    cks, ivs = man.checkpoint_entries, man.interval_entries
    tolerant = job.mode == "tolerant"
    worker_cpu, procs = 0.0, 1
    results: dict[int, tuple[bool, dict[str, Any]]]
    if executor is not None:
        tasks = [(i, *_task(i, held, cks, ivs, logs)) for i in chal]
        roots = {j: cks[j].root.hex() for j in held}
        try:
            results, worker_cpu, procs = executor.replay(job, ds, tasks, roots)
        except ExecutorFailed as e:
            rep.fail("replay", Reason.EXECUTOR_FAILED, str(e))
            return {}
        rep.figures["executor"] = executor.name
    elif workers > 1 and len(chal) > 1:
        results, worker_cpu, procs = _replay_parallel(
            job, ds, man, chal, held, workers, logs, device
        )
    elif chal:
        replayer = make_replayer(job, ds, device)
        results = {  # one interval's failure keeps the others' verdicts (reject wins, §14.1)
            i: _guarded(lambda i=i: replay_matches(replayer, *_task(i, held, cks, ivs, logs)))
            for i in chal
        }
    else:
        results = {}
    failed = {i: str(results.pop(i)[1][ERROR_KEY]) for i in chal if ERROR_KEY in results[i][1]}
    rep.figures.update(
        {
            "replayed_intervals": len(chal),
            "replayed_steps": sum(ivs[i].end_step - ivs[i].start_step for i in chal),
            "replay_wall_s": round(time.perf_counter() - t0, 4),
            "replay_cpu_s_workers": round(worker_cpu, 4),
            "replay_processes": procs,
        }
    )
    if tolerant:
        rep.figures["max_l2_distance"] = max(
            (r[1].get("l2", float("inf")) for r in results.values()), default=0.0
        )
        rep.figures["tolerance"] = job.pol["tolerance"]
    for i in chal:
        if i in failed:
            rep.fail("replay", Reason.INTERNAL_ERROR, f"interval {i}: {failed[i]}", i)
            continue
        ok, fig = results[i]
        if not ok:
            detail = (
                f" (normalised distance {fig['l2']:.3g} > {job.pol['tolerance']:g})"
                if tolerant and "l2" in fig
                else ""
            )
            if "reason" in fig:  # SPEC VI §5: the rounding log did not fit the replay
                rep.fail("replay", Reason(fig["reason"]), f"interval {i}: {fig['message']}", i)
                continue
            rep.fail(
                "replay",
                Reason.REPLAY_MISMATCH,
                f"interval {i} does not replay to its committed checkpoint{detail}",
                i,
            )
    from dk.verifier.loss import judge_losses

    judge_losses(rep, job, man, chal, results)  # SPEC §11.7
    rep.passed("replay")
    return results


@dataclass(frozen=True)
class ReplayResult:
    """Outcome of :func:`replay_interval`: ``verdict`` is ``accept``, ``reject`` or
    ``inconclusive`` (SPEC §14.1); ``reason`` is the code when not accepted."""

    verdict: str
    reason: Reason | None = None
    message: str = ""
    #: Data-parallel bundles: the ranks at fault (SPEC §12.6); empty otherwise.
    blame: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        """True iff the interval replays as committed."""
        return self.verdict == ACCEPT

    def __bool__(self) -> bool:
        return self.ok


def _result(code: Reason, message: str) -> ReplayResult:
    return ReplayResult(outcome_of([code]), code, message)


def _load_end(b: Path, spec: JobSpec, ck: ManifestCheckpoint, step: int) -> Tensors:
    """A checkpoint of the disputed interval, checked as :func:`verify_bundle` checks it
    (SPEC §12.2 step 14): root, schema, step and hyperparameters (its sampler state once the
    data, and so the epoch length, is known)."""
    end = parse_checkpoint(read_blob_file(b / ck.blob))
    if not digests_equal(checkpoint_root(end), ck.root):
        raise FormatError("end checkpoint does not hash to its root", reason="COMMITMENT_MISMATCH")
    check_schema(spec, step, end)
    check_step_state(spec, step, end, None)
    return end


def replay_interval(
    bundle: str | os.PathLike[str],
    job: JobSpec | str | os.PathLike[str],
    index: int,
    *,
    dataset: Dataset | None = None,
    tolerance: float | None = None,
) -> ReplayResult:
    """Replay interval ``index`` of a bundle against its committed end checkpoint.

    The dispute primitive of the market (SPEC Part V §6). ``accept`` iff both checkpoints hash
    to their committed roots and fit the job's schema and the replay (judged by the job's mode)
    reproduces the committed end; ``reject`` when the worker's evidence is wrong (with its
    reason code); ``inconclusive`` when this verifier cannot judge (its data, backend, a zk
    job, whose intervals are judged by proofs, or an internal error). Never raises.
    Signatures and the rest are :func:`verify_bundle`'s job. ``tolerance`` replaces the job's
    ``pol.tolerance`` in tolerant mode (a market order's profiled tolerance, SPEC V §12).
    """
    from dk.pol.replay import make_replayer, replay_matches

    try:
        b, spec = Path(bundle), as_job(job if isinstance(job, JobSpec | str) else Path(job))
    except FormatError as e:
        return _result(Reason.JOB_MALFORMED, str(e))
    if not b.is_dir():
        return _result(Reason.BUNDLE_NOT_FOUND, f"bundle directory not found: {b}")
    if spec.mode == "zk":
        return _result(
            Reason.MODE_UNSUPPORTED, "a zk interval is judged by its proofs, not by a replay"
        )
    try:
        man = parse_manifest(
            read_bounded(
                b / "manifest.json",
                MAX_MANIFEST_BYTES,
                Reason.MANIFEST_MISSING,
                Reason.MANIFEST_TOO_LARGE,
            )
        )
        cks, ivs = man.checkpoint_entries, man.interval_entries
        if not digests_equal(man.job_id, spec.job_id):
            return _result(Reason.JOB_MISMATCH, "bundle is for a different job")
        if not 0 <= index < len(ivs):
            return _result(Reason.TRANSCRIPT_MALFORMED, f"no interval {index}")
        for ck in (cks[index], cks[index + 1]):
            if ck.blob != blob_name(ck.root):
                return _result(Reason.BAD_PATH, f"checkpoint {ck.index} names another blob")
        a, z = ivs[index].start_step, ivs[index].end_step
        if tolerance is not None and spec.mode == "tolerant":  # after the job binding
            spec = spec.with_updates(pol={"tolerance": tolerance})
        start = _load_end(b, spec, cks[index], a)
        claimed = _load_end(b, spec, cks[index + 1], z) if spec.mode == "tolerant" else None
        log = None
        if spec.pol.get("backend") == "rounded":  # SPEC VI §5: the interval's rounding log
            from dk.pol.backends.ext import INTERVAL_KEY
            from dk.verifier.rounding import load_log

            ext = (ivs[index].ext or {}).get(INTERVAL_KEY)
            if ext is None:
                return _result(Reason.TRANSCRIPT_MALFORMED, f"interval {index} has no log")
            log = load_log(b, ext, spec.job_id, index, tau_log2=spec.rounding_tau_log2)
    except FormatError as e:
        code = Reason.__members__.get(e.reason or "", Reason.MANIFEST_MALFORMED)
        return _result(Reason(code), str(e))
    try:
        ds = dataset if dataset is not None else load_dataset(spec)
    except FormatError as e:
        code = (
            Reason.DECODER_MISMATCH if e.reason == "DECODER_MISMATCH" else Reason.DATA_UNAVAILABLE
        )
        return _result(code, f"the verifier's data: {e}")
    if not digests_equal(ds.root(), man.data_root):
        return _result(Reason.DATA_UNAVAILABLE, "the verifier's data has another root")
    spe = job_sampler(spec, len(ds)).steps_per_epoch
    for tensors, step in ((start, a), (claimed, z)):
        try:
            if tensors is not None:  # SPEC §10.1: the sampler state of its step
                check_step_state(spec, step, tensors, spe)
        except FormatError as e:
            return _result(Reason(e.reason or "STEP_MISMATCH"), str(e))
    try:
        ok, fig = replay_matches(
            make_replayer(spec, ds), start, claimed, cks[index + 1].root, a, z, log
        )
    except (BackendUnavailable, ImportError) as e:
        return _result(Reason.BACKEND_UNAVAILABLE, str(e))
    except Exception as e:  # the verifier's own failure is never the worker's fault
        return _result(Reason.INTERNAL_ERROR, f"{type(e).__name__}: {e}")
    blame: tuple[int, ...] = ()
    if "rank_steps" in fig:  # a data-parallel bundle: blame by rank (SPEC §12.6)
        from dk.verifier.blame import DIGEST, blame_interval, read_rank_steps

        committed = (ivs[index].ext or {}).get("rank_digests") or []
        if len(committed) != spec.world_size:
            return _result(Reason.TRANSCRIPT_MALFORMED, f"interval {index} lacks rank digests")
        evidence = read_rank_steps(b, index, DIGEST * len(committed) * (z - a))
        blame = tuple(blame_interval(index, committed, fig["rank_steps"], ok, evidence))
        if ok and blame:
            return ReplayResult(
                REJECT, Reason.RANK_DIGEST_MISMATCH, f"interval {index}: rank digests", blame
            )
    elif spec.world_size > 1 and spec.mode == "tolerant" and not ok and "reason" not in fig:
        from dk.verifier.blame import tolerant_blame

        try:
            blame = tuple(tolerant_blame(spec, ds, b, ivs[index], start)[0])
        except Exception as e:  # the verifier's own failure names no rank
            return _result(Reason.INTERNAL_ERROR, f"blame: {type(e).__name__}: {e}")
    if not ok and "reason" in fig:  # SPEC VI §5: the rounding log does not fit this replay
        return _result(Reason(fig["reason"]), fig["message"])
    if not ok:
        return ReplayResult(
            REJECT, Reason.REPLAY_MISMATCH, f"interval {index} does not replay", blame
        )
    from dk.verifier.loss import loss_finding

    bad = loss_finding(spec, ivs[index], fig)  # SPEC §11.7
    if bad is not None:
        return ReplayResult(REJECT, *bad)
    return ReplayResult(ACCEPT)
