"""Resume an interrupted run from its last committed checkpoint (nothing lost, nothing changed).

A run directory whose training stopped (a crash, ``SIGKILL``, a power cut after the page cache
reached the disk) holds ``run.log.jsonl`` and no ``run.json``. Every line of the log names a
checkpoint whose blob was fully written before the line was, so the log's longest valid prefix
is a committed run up to its last checkpoint ``L`` (a torn last line is dropped).

Resuming loads ``L``'s tensors and restores from them everything that shapes the following
steps: parameters and buffers, optimizer state, codec state, the step (the learning-rate
schedule's whole state, SPEC §8.4) and the sampler position (SPEC §8.1). No RNG state needs
saving: every random draw of step ``t`` comes from generators seeded by the job's seed and
``t`` (SPEC §8.3). So in exact mode the resumed run commits the same checkpoints, intervals,
losses and transcript root as an uninterrupted one, bit for bit.

A rounded run (SPEC Part VI) commits each interval's rounding log by the ``ext.rounding_log``
of the interval's line, and the torch release by the ``ext`` of checkpoint 0's line. The
committed prefix ends before the first interval whose named log is not whole in ``logs/`` (a
log written, then lost before it reached the disk): that interval is trained again.

A partial run is refused (``FormatError``, exit 3) when its checkpoint 0 is not the job's or
its first line names another ``job_id`` (another job's directory: two jobs that differ only in,
say, ``pol.backend`` start from the same checkpoint 0), its steps are not the job's
``0, k, 2k, …``, a blob is missing or has another size, or the last checkpoint does not hash
to its logged root.

Blobs are read where the run keeps them (:class:`dk.pol.pack.RunBlobs`: ``blobs.pack`` or
``blobs/`` files, so a run recorded before packs resumes too). Records the pack holds past the
last one the log names (written, then the process died before their lines; or torn) are cut
off by :func:`rewrite_log`, so the resumed run appends right after its committed prefix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dk.crypto.hashing import digests_equal
from dk.errors import FormatError
from dk.pol.backends.ext import INTERVAL_KEY, check_log_ext, log_blob_name
from dk.pol.backends.log import log_digest
from dk.pol.checkpoint import Tensors, check_schema, checkpoint_root, initial_checkpoint
from dk.pol.job import JobSpec
from dk.pol.pack import RunBlobs, truncate_pack
from dk.pol.run import CheckpointEntry, IntervalEntry, atomic_write

__all__ = ["PartialRun", "has_partial_run", "read_partial_run"]

LOG = "run.log.jsonl"
MAX_LOG_BYTES = 256 * 1024 * 1024


@dataclass
class PartialRun:
    """The committed prefix of an interrupted run."""

    checkpoints: list[CheckpointEntry]
    intervals: list[IntervalEntry]
    last: Tensors  # the tensors of the last committed checkpoint (verified against its root)
    lines: list[str]  # the log's valid lines, as written
    pack_end: int = 0  # where blobs.pack is cut back to: past the last record the log names
    run_ext: dict[str, Any] | None = None  # the run's ext as checkpoint 0's line committed it
    job_named: bool = False  # checkpoint 0's line names the job (a run recorded before: no)

    @property
    def step(self) -> int:
        """The step of the last committed checkpoint (where training resumes)."""
        return self.checkpoints[-1].step

    @property
    def next_index(self) -> int:
        """The index of the next checkpoint to commit."""
        return len(self.checkpoints)


def has_partial_run(run_dir: str | Path) -> bool:
    """True when ``run_dir`` holds a started, unfinished run (a log and no ``run.json``)."""
    d = Path(run_dir)
    log = d / LOG
    return not (d / "run.json").exists() and log.is_file() and log.stat().st_size > 0


def _valid_lines(data: bytes, job: JobSpec, run_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """The longest prefix of log lines that parse and follow on (indices, steps, intervals)
    and, for a rounded job, whose intervals' logs are whole."""
    steps = job.checkpoint_steps()
    out: list[tuple[str, dict[str, Any]]] = []
    for raw in data.split(b"\n"):
        try:
            line = raw.decode("utf-8")
            d = json.loads(line)
            ck = d["checkpoint"]
            j = len(out)
            if ck["index"] != j or j >= len(steps) or ck["step"] != steps[j]:
                break
            iv = d.get("interval")
            if (j == 0) != (iv is None):
                break
            if iv is not None and (iv["index"], iv["end_step"]) != (j - 1, steps[j]):
                break
        except (UnicodeDecodeError, ValueError, KeyError, TypeError):
            break  # a torn last line (or garbage): the committed prefix ends here
        out.append((line, d))
    if job.pol.get("backend") == "rounded":  # SPEC VI §4: up to the first log not whole
        for j, (_, d) in enumerate(out[1:], start=1):
            ext = d["interval"].get("ext")
            if not isinstance(ext, dict) or not _log_is_whole(run_dir, ext.get(INTERVAL_KEY)):
                return out[:j]
    return out


def _log_is_whole(run_dir: Path, ext: Any) -> bool:
    """Whether ``ext`` (an interval's ``ext.rounding_log``) names a log that ``run_dir`` holds
    whole: at ``logs/<digest>.dkrl``, of its size, with its digest (SPEC VI §4)."""
    try:
        check_log_ext(ext, "rounding_log")
    except ValueError:
        return False
    path = run_dir / ext["blob"]
    if ext["blob"] != log_blob_name(bytes.fromhex(ext["digest"])) or not path.is_file():
        return False
    if path.is_symlink() or path.stat().st_size != ext["nbytes"]:
        return False
    return digests_equal(log_digest(path.read_bytes()), bytes.fromhex(ext["digest"]))


def read_partial_run(run_dir: str | Path, job: JobSpec, steps_per_epoch: int) -> PartialRun | None:
    """The committed prefix of the interrupted run in ``run_dir`` (``None`` if it has none).

    Raises:
        FormatError: the partial run is not this job's, or its blobs are not what it logged.
    """
    d = Path(run_dir)
    with open(d / LOG, "rb") as f:
        data = f.read(MAX_LOG_BYTES + 1)
    if len(data) > MAX_LOG_BYTES:
        raise FormatError(f"{d / LOG} is over {MAX_LOG_BYTES} bytes")
    lines = _valid_lines(data, job, d)
    if not lines:
        return None
    cks = [CheckpointEntry(**ln[1]["checkpoint"]) for ln in lines]
    ivs = [IntervalEntry(**ln[1]["interval"]) for ln in lines[1:]]
    init = checkpoint_root(initial_checkpoint(job, steps_per_epoch))
    named = lines[0][1].get("job_id")  # absent in a run recorded before dk wrote it
    if (named is not None and named != job.job_id.hex()) or not digests_equal(
        bytes.fromhex(cks[0].root), init
    ):
        raise FormatError(
            f"{d} holds a partial run of another job (its checkpoint 0 or its job_id is not "
            "this job's); train into a new directory"
        )
    blobs = RunBlobs(d)
    roots = [bytes.fromhex(ck.root) for ck in cks]
    for ck, root in zip(cks, roots, strict=True):
        if not blobs.has(root, ck.nbytes):
            raise FormatError(f"cannot resume {d}: blob of checkpoint {ck.index} is missing")
    try:
        last = dict(blobs.checkpoint(roots[-1], cks[-1].nbytes))
    except FormatError as e:
        raise FormatError(
            f"cannot resume {d}: checkpoint {cks[-1].index} is corrupt ({e})"
        ) from None
    check_schema(job, cks[-1].step, last)
    run_ext = lines[0][1].get("ext")
    return PartialRun(
        cks,
        ivs,
        last,
        [ln[0] for ln in lines],
        blobs.packed_end(roots),
        run_ext if isinstance(run_ext, dict) else None,
        named is not None,
    )


def rewrite_log(run_dir: str | Path, partial: PartialRun) -> None:
    """Cut the log back to its committed prefix (a torn last line would break the appends),
    and ``blobs.pack`` back to the records it names (SPEC §11.8)."""
    text = "".join(line + "\n" for line in partial.lines)
    atomic_write(Path(run_dir) / LOG, text.encode("utf-8"))
    truncate_pack(run_dir, partial.pack_end)


def advance_scheduler(scheduler: Any, steps: int) -> None:
    """Step a user's LR scheduler to step ``steps`` (its state is the step, SPEC §8.4)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()"
        for _ in range(steps):
            scheduler.step()
