"""The Recorder's commit pipeline: checkpoints committed in batches (SPEC §10–§11).

Training hands each snapshot to :meth:`CommitWriter.put` and goes on. A commit computes each
checkpoint's root (SPEC §4.2), encodes its blob (SPEC §10.3), derives the interval that ends at
it (batch commitment SPEC §8.2, update norm SPEC §11.1) and appends one line to
``run.log.jsonl``. Small blobs are appended to ``blobs.pack`` (:mod:`dk.pol.pack`, SPEC §11.8),
a batch with one write; a large one is a file of its own.

* **Batched.** Checkpoints are committed ``B`` at a time (``B·size ≤ BATCH_BYTES``, at most
  ``MAX_BATCH``; a large checkpoint goes alone, ``B = 1``): one pack write, one log write and
  one pass of update norms (:func:`update_norms`) per batch.
* **Where.** A large checkpoint (over ``INLINE_BYTES``) is committed on a background thread,
  whose hashing and writing release the GIL and overlap training. A small one is committed
  by the :meth:`~CommitWriter.put` that fills its batch, on the training thread: its commit is
  mostly Python that holds the GIL, and handing the GIL between two threads (each of the
  training loop's many kernel calls releases it) cost more than the commit itself (a small
  CNN at ``k = 5``, ``bench/bench_recording.py``'s cnn part: 1.05–1.07× plain inline against
  1.17–1.23× on the thread, two runs). The thread still commits a batch that is not full after
  ``BATCH_WAIT_S``.
* **Bounded.** At most ``depth · B`` snapshots wait; a producer faster than the disk waits
  too, so memory stays at about ``2 · depth · B + 1`` checkpoints (a few MiB of small ones).
* **Nothing claimed that is not there.** A batch's log lines are written only after its blobs
  have been written whole (the pack's records, then the lines); ``run.json`` (the only file
  that says a run is complete) is written by the Recorder after :meth:`CommitWriter.close`
  has returned and every file has been synced. A crash leaves a log that names only whole
  blobs, and no ``run.json``; it loses the checkpoints put in the last ``BATCH_WAIT_S``, and
  those queued behind a commit in progress (at most ``depth · B``, see **Bounded**).
* **Errors surface.** A commit's exception is raised by the ``put`` that committed inline, or
  (on the thread) again by the next ``put`` and by ``close``, in the training thread; nothing
  after it is committed.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from dk.pol.checkpoint import (
    Tensors,
    checkpoint_root,
    encode_blob_parts,
    update_norm,
    write_blob,
)
from dk.pol.pack import PACK_MAX_BLOB, PACK_NAME, PackWriter, pack_record
from dk.pol.run import CheckpointEntry, IntervalEntry, RunInfo
from dk.pol.sampler import Sampler

__all__ = ["CommitWriter"]

LOG_NAME = "run.log.jsonl"
#: Small checkpoints are committed this many bytes at a time: one commit and one log write
#: per batch, the hashing code warm in cache (k = 5 on a small model commits a
#: checkpoint every few milliseconds). A checkpoint over half of it goes alone (``depth``).
BATCH_BYTES = 4 * 1024 * 1024
MAX_BATCH = 32
#: A batch that is not full is committed after this long (what a crash loses: module docstring).
BATCH_WAIT_S = 0.25
#: A checkpoint of at most this many bytes is committed inline (on the training thread, by the
#: ``put`` that fills its batch): hashing it takes less time than the Python around it.
INLINE_BYTES = 256 * 1024
#: A batch's update norms are computed together (:func:`update_norms`) up to this much memory.
BATCH_NORM_BYTES = 16 * 1024 * 1024


class CommitWriter:
    """Commits ``(index, step, checkpoint)`` items in order, a batch at a time."""

    def __init__(
        self,
        run_dir: Path,
        info: RunInfo,
        sampler: Sampler,
        *,
        depth: int = 2,
        batch_bytes: int = BATCH_BYTES,
        inline_bytes: int = INLINE_BYTES,
    ) -> None:
        self.run_dir, self.info, self.sampler = run_dir, info, sampler
        self._depth, self._batch_bytes = max(1, depth), batch_bytes
        self._inline_bytes = inline_bytes
        self._batch = 0  # checkpoints per batch: set at the first put, from its size
        self._inline = False  # small checkpoints: full batches committed by put (set there)
        self._items: collections.deque[tuple[int, int, Tensors, dict[str, Any] | None]] = (
            collections.deque()
        )
        self._since = 0.0  # monotonic time the oldest queued item was put
        self._cv = threading.Condition()
        self._commit_lock = threading.Lock()  # one batch committed at a time, in queue order
        self._closing = False
        self._prev: Tensors | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._pack: PackWriter | None = None
        self._log: Any = None
        #: The pack and every blob file written: what must be synced (with the log) before
        #: the run is complete.
        self.written: list[Path] = []
        #: Batches committed by :meth:`put` on the caller's thread (inline) and by the
        #: background thread (diagnostics; tests prove which path ran).
        self.batches = {"inline": 0, "thread": 0}

    @property
    def log_path(self) -> Path:
        """The run's ``run.log.jsonl``."""
        return self.run_dir / LOG_NAME

    def pending(self) -> int:
        """Checkpoints queued and not yet taken for committing."""
        return len(self._items)

    def start(self, *, prev: Tensors | None = None, truncate: bool = True) -> None:
        """Open the log and the pack and start the thread; ``truncate`` creates an empty log and
        pack. A resumed run passes its last committed checkpoint as ``prev`` (the start of the
        next interval) and keeps its log and pack (both cut back to what the log names,
        :func:`dk.pol.resume.rewrite_log`).
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if truncate:
            self.log_path.write_text("")
        self._pack = PackWriter(self.run_dir / PACK_NAME, fresh=truncate)
        self.written.append(self._pack.path)
        try:
            self._log = open(self.log_path, "a", encoding="utf-8")
            self._prev = prev
            self._thread = threading.Thread(target=self._loop, name="dk-commit", daemon=True)
            self._thread.start()
        except BaseException:  # nothing left open
            self._thread = None
            if self._log is not None:
                self._log.close()
            self._pack.close()
            raise

    def put(self, index: int, step: int, ck: Tensors, ext: dict[str, Any] | None = None) -> None:
        """Queue checkpoint ``index`` (taken at ``step``) and the ``ext`` object (SPEC §11.5) of
        the interval it ends (a new run's checkpoint 0: the run's ``ext``); raises the error of
        an earlier commit, if any (a checkpoint put while the thread's commit fails is not
        committed: the next ``put`` or ``close`` raises). A small checkpoint that fills its
        batch commits the batch here, on the caller's thread, and raises its error.

        ``ck`` must not change afterwards (a snapshot, not live weights).
        """
        if not self._batch:  # every checkpoint of a run has the same size
            nbytes = sum(v.nbytes for v in ck.values())
            self._batch = max(1, min(MAX_BATCH, self._batch_bytes // max(1, nbytes)))
            self._inline = nbytes <= self._inline_bytes
        with self._cv:
            while self._error is None and len(self._items) >= self._depth * self._batch:
                self._cv.wait(0.5)
            if self._error is not None:
                raise self._error
            if not self._items:
                self._since = time.monotonic()
            self._items.append((index, step, ck, ext))
            full = len(self._items) >= self._batch
            if full and not self._inline:
                self._cv.notify_all()
        if full and self._inline:
            self._commit_queued("inline")

    def close(self) -> list[Path]:
        """Wait for every queued checkpoint; raise the first commit error; return the files
        written (the pack, blob files, then the log)."""
        self._stop()
        if self._error is not None:
            raise self._error
        return [*self.written, self.log_path]

    def abort(self) -> None:
        """Commit what is queued and stop (training failed); errors are dropped."""
        with contextlib.suppress(Exception):
            self._stop()

    def _stop(self) -> None:
        """Let the thread commit what is queued, then close the log and the pack; an error
        closing the log (its last flush) is the writer's error if it has none."""
        if self._thread is None:
            return
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join()  # it commits what is queued, then ends
        self._thread = None
        assert self._pack is not None
        try:
            self._log.close()
        except BaseException as e:
            with self._cv:
                if self._error is None:
                    self._error = e
        finally:
            self._pack.close()

    def _ready(self) -> bool:
        """Whether the thread commits now (called with the condition held): closing; a full
        batch of large checkpoints; or a batch that is not full, queued ``BATCH_WAIT_S`` ago."""
        if self._closing:
            return True
        if not self._items:
            return False
        if not self._inline and len(self._items) >= self._batch:
            return True
        return time.monotonic() - self._since >= BATCH_WAIT_S

    def _loop(self) -> None:
        """The thread: commits full batches of large checkpoints, and any batch waiting
        ``BATCH_WAIT_S``; ends when closed and drained, or at an error of its own commit."""
        try:
            while True:
                with self._cv:
                    while not self._ready():
                        wait = BATCH_WAIT_S
                        if self._items:
                            wait = max(0.0, self._since + BATCH_WAIT_S - time.monotonic())
                        self._cv.wait(wait)
                    if self._closing and not self._items:
                        return
                self._commit_queued("thread")
        except BaseException as e:  # surfaced in the training thread
            with self._cv:
                if self._error is None:
                    self._error = e
                self._items.clear()
                self._cv.notify_all()

    def _commit_queued(self, who: str) -> None:
        """Commit every queued checkpoint as one batch (none after an error). The batch is
        taken under the commit lock, so batches are committed in the order they were put."""
        with self._commit_lock:
            with self._cv:
                batch = list(self._items)
                self._items.clear()
                self._cv.notify_all()  # a producer waiting for room
                if self._error is not None or not batch:
                    return
            try:
                self._commit_batch(batch)
            except BaseException as e:
                with self._cv:
                    self._error = e
                    self._items.clear()  # nothing after a failure is committed
                    self._cv.notify_all()
                raise
            self.batches[who] += 1

    def _commit_batch(self, batch: list[tuple[int, int, Tensors, dict[str, Any] | None]]) -> None:
        """Roots, blobs and intervals of ``batch``; its records, then its log lines."""
        lines: list[str] = []
        records: list[bytes | memoryview] = []
        prev = self._prev
        # the batch's update norms at once; item j's is norms[j + off] (none for j = 0 of a
        # new run: checkpoint 0 ends no interval)
        off = 0 if prev is not None else -1
        norms = update_norms(([prev] if prev is not None else []) + [b[2] for b in batch])
        for j, (index, step, ck, ext) in enumerate(batch):
            try:
                norm = norms[j + off] if norms is not None and j + off >= 0 else None
                lines.append(self._commit(index, step, ck, prev, ext, records, norm))
            except BaseException:
                self._write(records, lines)  # what precedes the failure
                raise
            prev = self._prev = ck
        self._write(records, lines)

    def _write(self, records: list[bytes | memoryview], lines: list[str]) -> None:
        """Append a batch's records to the pack with one write, then the lines naming them."""
        assert self._pack is not None
        if records:
            self._pack.write(b"".join(records))
        if lines:
            self._log.write("".join(lines))
            self._log.flush()

    def _commit(
        self,
        index: int,
        step: int,
        ck: Tensors,
        prev: Tensors | None,
        ext: dict[str, Any] | None,
        records: list[bytes | memoryview],
        norm: float | None = None,
    ) -> str:
        """Root, blob and interval of one checkpoint; its log line. A small blob's record is
        added to ``records`` (written by the caller before the line); a large one is written
        as a file here."""
        root = checkpoint_root(ck)
        parts: list[bytes | memoryview] = []
        nbytes = PACK_MAX_BLOB + 1
        if sum(v.nbytes for v in ck.values()) <= PACK_MAX_BLOB:
            parts, nbytes = encode_blob_parts(ck)
        packed = nbytes <= PACK_MAX_BLOB
        if not packed:
            _, path, nbytes = write_blob(self.run_dir, ck, root, durable=False)
            self.written.append(path)
        entry = CheckpointEntry(index=index, step=step, root=root.hex(), nbytes=nbytes)
        self.info.checkpoints.append(entry)
        line: dict[str, Any] = {"checkpoint": entry.__dict__}
        if prev is None:  # a new run's checkpoint 0: the job and the run's ext (dk.pol.resume)
            line["job_id"] = self.info.job_id
            if ext is not None:
                line["ext"] = ext
        else:
            start = self.info.checkpoints[index - 1].step
            iv = IntervalEntry(
                index=index - 1,
                start_step=start,
                end_step=step,
                batch_commitment=self.sampler.batch_commitment(index - 1, start, step).hex(),
                update_norm=norm if norm is not None else update_norm(prev, ck),
                ext=ext,
            )
            self.info.intervals.append(iv)
            line["interval"] = iv.__dict__
        if packed:  # last: a record is added only with its line
            records.append(pack_record(root, nbytes))
            records.extend(parts)
        return json.dumps(line, check_circular=False) + "\n"  # 5x faster; plain data


def update_norms(chain: list[Tensors]) -> list[float] | None:
    """``[update_norm(chain[i], chain[i + 1]) for each i]`` (SPEC §11.1) computed together.

    One row per interval: the squared differences of the ``model/*`` tensors in name order
    (binary64), then the fold sum of SPEC §1.4 on every row at once (``row[:h] += row[n-h:n]``
    until one term is left). Each element of each row sees exactly the additions of
    :func:`dk.crypto.numeric.model_update_norm`, so every norm has the same bits; a batch costs
    one pass of NumPy calls instead of one per interval. ``None`` (compute them one by one)
    when the checkpoints do not share the model tensors' names and sizes, for a single interval,
    or over ``BATCH_NORM_BYTES``.
    """
    if len(chain) < 3:  # one interval: nothing to share
        return None
    names = sorted(k for k in chain[0] if k.startswith("model/"))
    sizes = [int(chain[0][k].size) for k in names]
    rows, total = len(chain) - 1, sum(sizes)
    if (rows + 1) * total * 8 > BATCH_NORM_BYTES:  # a large model: one at a time, no copies
        return None
    d = np.empty((rows, total), dtype=np.float64)
    o = 0
    for k, n in zip(names, sizes, strict=True):
        try:
            stack = np.stack([c[k].reshape(-1) for c in chain])
        except (KeyError, ValueError):  # a missing tensor, or another size
            return None
        if stack.shape[1] != n or stack.dtype.kind not in "fiu":
            return None
        np.subtract(stack[1:], stack[:-1], out=d[:, o : o + n], dtype=np.float64)
        o += n
    np.multiply(d, d, out=d)
    if total == 0:
        return [0.0] * rows
    n = total
    while n > 1:
        h = n // 2
        np.add(d[:, :h], d[:, n - h : n], out=d[:, :h])
        n -= h
    return [math.sqrt(float(x)) for x in d[:, 0]]
