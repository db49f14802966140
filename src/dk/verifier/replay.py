"""Replaying challenged intervals (SPEC §12.3), locally or over worker processes, and the
market's dispute primitive :func:`replay_interval`."""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from dk.crypto.hashing import digests_equal
from dk.errors import FormatError
from dk.pol.checkpoint import blob_name, check_schema, checkpoint_root, parse_blob, read_blob_file
from dk.pol.data import Dataset, load_dataset
from dk.pol.job import JobSpec, as_job
from dk.pol.transcript import MAX_MANIFEST_BYTES, parse_manifest
from dk.verifier.report import Reason, Report
from dk.verifier.verify import _read_bounded

_WORKER_REPLAYERS: dict[str, Any] = {}


def _replay_task(
    spec: dict[str, Any],
    base_dir: str,
    start_path: str,
    start_root: str,
    end_path: str | None,
    claimed_root: str,
    start_step: int,
    end_step: int,
) -> tuple[bool, dict[str, Any], float]:
    """Worker-process entry: replay one interval from blob files (start root re-checked)."""
    from dk.pol.replay import make_replayer, replay_matches

    t0 = time.process_time()
    job = JobSpec(spec, Path(base_dir))
    key = job.job_id.hex()
    if key not in _WORKER_REPLAYERS:  # one replayer per job per worker process
        _WORKER_REPLAYERS[key] = make_replayer(job, load_dataset(job))
    start = parse_blob(read_blob_file(Path(start_path)))
    if not digests_equal(checkpoint_root(start), bytes.fromhex(start_root)):
        return (
            False,
            {"error": "start checkpoint changed during verification"},
            time.process_time() - t0,
        )
    claimed = parse_blob(read_blob_file(Path(end_path))) if end_path else None
    ok, fig = replay_matches(
        _WORKER_REPLAYERS[key], start, claimed, bytes.fromhex(claimed_root), start_step, end_step
    )
    return ok, fig, time.process_time() - t0


def replay_challenged(
    rep: Report,
    bundle: Path,
    job: JobSpec,
    ds: Dataset,
    m: dict[str, Any],
    chal: list[int],
    held: dict[int, dict[str, np.ndarray]],
    workers: int,
) -> None:
    from dk.pol.replay import make_replayer, replay_matches

    t0 = time.perf_counter()
    cks, ivs = m["checkpoints"], m["intervals"]
    tolerant = job.mode == "tolerant"
    results: dict[int, tuple[bool, dict[str, Any]]] = {}
    worker_cpu = 0.0
    if workers > 1 and len(chal) > 1:
        import multiprocessing as mp

        with ProcessPoolExecutor(
            max_workers=min(workers, len(chal)), mp_context=mp.get_context("spawn")
        ) as pool:
            futs = {
                i: pool.submit(
                    _replay_task,
                    job.spec,
                    str(job.base_dir),
                    str(bundle / cks[i]["blob"]),
                    cks[i]["root"],
                    str(bundle / cks[i + 1]["blob"]) if tolerant else None,
                    cks[i + 1]["root"],
                    ivs[i]["start_step"],
                    ivs[i]["end_step"],
                )
                for i in chal
            }
            for i, fut in futs.items():
                ok, fig, cpu = fut.result()
                results[i] = (ok, fig)
                worker_cpu += cpu
    else:
        replayer = make_replayer(job, ds)
        for i in chal:
            results[i] = replay_matches(
                replayer,
                held[i],
                held.get(i + 1),
                bytes.fromhex(cks[i + 1]["root"]),
                ivs[i]["start_step"],
                ivs[i]["end_step"],
            )
    replayed_steps = sum(ivs[i]["end_step"] - ivs[i]["start_step"] for i in chal)
    rep.figures.update(
        {
            "replayed_intervals": len(chal),
            "replayed_steps": replayed_steps,
            "replay_wall_s": round(time.perf_counter() - t0, 4),
            "replay_cpu_s_workers": round(worker_cpu, 4),
        }
    )
    if tolerant:
        rep.figures["max_l2_distance"] = max(
            (r[1].get("l2", float("inf")) for r in results.values()), default=0.0
        )
        rep.figures["tolerance"] = job.pol["tolerance"]
    for i in chal:
        ok, fig = results[i]
        if not ok:
            detail = (
                f" (normalised distance {fig['l2']:.3g} > {job.pol['tolerance']:g})"
                if tolerant and "l2" in fig
                else ""
            )
            rep.fail(
                "replay",
                Reason.REPLAY_MISMATCH,
                f"interval {i} does not replay to its committed checkpoint{detail}",
                i,
            )
    rep.passed("replay")


def replay_interval(
    bundle: str | os.PathLike[str],
    job: JobSpec | str | os.PathLike[str],
    index: int,
    *,
    dataset: Dataset | None = None,
) -> bool:
    """Replay interval ``index`` of a bundle against its committed end checkpoint.

    The dispute primitive of the market: True iff the start blob hashes to its committed root
    and the replay (judged by the job's mode) reproduces the committed end. Never raises on a
    malformed bundle (returns False); signatures and the rest are :func:`verify_bundle`'s job.
    """
    from dk.pol.replay import make_replayer, replay_matches

    try:
        b, spec = Path(bundle), as_job(job)
        man = parse_manifest(
            _read_bounded(
                b / "manifest.json",
                MAX_MANIFEST_BYTES,
                Reason.MANIFEST_MISSING,
                Reason.MANIFEST_TOO_LARGE,
            )
        )
        cks, ivs = man.checkpoints, man.intervals
        if not 0 <= index < len(ivs) or not digests_equal(man.job_id, spec.job_id):
            return False
        for ck in (cks[index], cks[index + 1]):
            if ck["blob"] != blob_name(bytes.fromhex(ck["root"])):
                return False
        start = parse_blob(read_blob_file(b / cks[index]["blob"]))
        if not digests_equal(checkpoint_root(start), bytes.fromhex(cks[index]["root"])):
            return False
        check_schema(spec, ivs[index]["start_step"], start)
        claimed = None
        if spec.mode == "tolerant":
            claimed = parse_blob(read_blob_file(b / cks[index + 1]["blob"]))
            if not digests_equal(checkpoint_root(claimed), bytes.fromhex(cks[index + 1]["root"])):
                return False
        ds = dataset if dataset is not None else load_dataset(spec)
        ok, _ = replay_matches(
            make_replayer(spec, ds),
            start,
            claimed,
            bytes.fromhex(cks[index + 1]["root"]),
            ivs[index]["start_step"],
            ivs[index]["end_step"],
        )
        return ok
    except FormatError:
        return False
