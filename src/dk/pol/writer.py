"""The Recorder's commit pipeline: checkpoints committed on a background thread (SPEC §10–§11).

Training hands each snapshot to :meth:`CommitWriter.put` and goes on; one thread computes its
root (SPEC §4.2), writes its blob (SPEC §10.3), derives the interval that ends at it (batch
commitment SPEC §8.2, update norm SPEC §11.1) and appends one line to ``run.log.jsonl``.

* **Bounded.** At most ``depth`` snapshots wait; a producer faster than the disk waits too,
  so memory stays at ``depth + 2`` checkpoints.
* **Nothing claimed that is not there.** A log line is written only after its blob has been
  renamed into place; ``run.json`` (the only file that says a run is complete) is written by
  the Recorder after :meth:`CommitWriter.close` has returned and every file has been synced.
  A crash leaves a log that names only whole blobs, and no ``run.json``.
* **Errors surface.** An exception on the thread is raised again by the next ``put`` and by
  ``close``, in the training thread.
"""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Any

from dk.pol.checkpoint import Tensors, checkpoint_root, update_norm, write_blob
from dk.pol.run import CheckpointEntry, IntervalEntry, RunInfo
from dk.pol.sampler import Sampler

__all__ = ["CommitWriter"]

LOG_NAME = "run.log.jsonl"


class CommitWriter:
    """Commits ``(index, step, checkpoint)`` items in order on one background thread."""

    def __init__(self, run_dir: Path, info: RunInfo, sampler: Sampler, *, depth: int = 2) -> None:
        self.run_dir, self.info, self.sampler = run_dir, info, sampler
        self._queue: queue.Queue[tuple[int, int, Tensors, dict[str, Any] | None] | None] = (
            queue.Queue(maxsize=depth)
        )
        self._prev: Tensors | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        #: Every blob written, then the log: what must be synced before the run is complete.
        self.written: list[Path] = []

    @property
    def log_path(self) -> Path:
        """The run's ``run.log.jsonl``."""
        return self.run_dir / LOG_NAME

    def start(self, *, prev: Tensors | None = None, truncate: bool = True) -> None:
        """Start the thread; ``truncate`` creates an empty log. A resumed run passes its last
        committed checkpoint as ``prev`` (the start of the next interval) and keeps its log."""
        (self.run_dir / "blobs").mkdir(parents=True, exist_ok=True)
        if truncate:
            self.log_path.write_text("")
        self._prev = prev
        self._thread = threading.Thread(target=self._loop, name="dk-commit", daemon=True)
        self._thread.start()

    def put(self, index: int, step: int, ck: Tensors, ext: dict[str, Any] | None = None) -> None:
        """Queue checkpoint ``index`` (taken at ``step``) and the ``ext`` object (SPEC §11.5) of
        the interval it ends; raises the thread's error, if any.

        ``ck`` must not change afterwards (a snapshot, not live weights).
        """
        while True:
            if self._error is not None:
                raise self._error
            try:
                self._queue.put((index, step, ck, ext), timeout=0.5)
            except queue.Full:
                continue
            return

    def close(self) -> list[Path]:
        """Wait for every queued checkpoint; raise the thread's error; return the files written
        (blobs, then the log)."""
        self._stop()
        if self._error is not None:
            raise self._error
        return [*self.written, self.log_path]

    def abort(self) -> None:
        """Stop the thread after what is queued (training failed); errors are dropped."""
        self._stop()

    def _stop(self) -> None:
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join()
        self._thread = None

    def _loop(self) -> None:
        prev: Tensors | None = self._prev
        log = open(self.log_path, "a", encoding="utf-8")
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                index, step, ck, ext = item
                line = self._commit(index, step, ck, prev, ext)
                log.write(line)
                if self._queue.empty():  # caught up: flush; behind: one flush for the batch
                    log.flush()
                prev = ck
        except BaseException as e:  # surfaced in the training thread
            self._error = e
            while True:  # drain so the producer never blocks forever
                try:
                    if self._queue.get(timeout=1.0) is None:
                        return
                except queue.Empty:
                    return
        finally:
            log.close()

    def _commit(
        self,
        index: int,
        step: int,
        ck: Tensors,
        prev: Tensors | None,
        ext: dict[str, Any] | None = None,
    ) -> str:
        """Root, blob and interval of one checkpoint; its log line."""
        root = checkpoint_root(ck)
        _, path, nbytes = write_blob(self.run_dir, ck, root, durable=False)
        self.written.append(path)
        entry = CheckpointEntry(index=index, step=step, root=root.hex(), nbytes=nbytes)
        self.info.checkpoints.append(entry)
        line: dict[str, Any] = {"checkpoint": entry.__dict__}
        if prev is not None:
            start = self.info.checkpoints[index - 1].step
            iv = IntervalEntry(
                index=index - 1,
                start_step=start,
                end_step=step,
                batch_commitment=self.sampler.batch_commitment(index - 1, start, step).hex(),
                update_norm=update_norm(prev, ck),
                ext=ext,
            )
            self.info.intervals.append(iv)
            line["interval"] = iv.__dict__
        return json.dumps(line) + "\n"
