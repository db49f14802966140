"""The Recorder's side of ``pol.backend = "rounded"``: one rounding log per interval (SPEC VI).

:class:`RoundingRecorder` keeps a :class:`~dk.pol.backends.rounded.RoundedMode` active on the
training thread from ``attach`` to ``finish``, one mode per interval. The Recorder pauses it
for its own bookkeeping (finiteness check, snapshots), so the log holds exactly the training
step's rounding sites, the ones a verifier's replay (:func:`dk.pol.replay.Replayer.run`)
executes. At each checkpoint it encodes the interval's log, writes it to
``RUN/logs/<digest>.dkrl`` and keeps the interval's ``ext.rounding_log`` (SPEC VI §4).

Two record-time checks stop a loop whose log a verifier could not follow (SPEC VI §6):

* every step's sequence of rounding sites must equal the first step's (a loop that computes,
  say, a float metric every 100 steps adds sites the job's step does not have);
* at the first checkpoint, interval 0 is replayed from checkpoint 0 under its own log with
  the job's canonical step; a different root means the loop does not compute the job's step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dk.errors import JobMismatch
from dk.pol.backends.ext import INTERVAL_KEY, RUN_KEY, check_run_ext, log_ext, torch_release
from dk.pol.backends.rounded import RoundedMode


class RoundingRecorder:
    """Record one rounding log per interval of a Recorder's run (see module docs)."""

    def __init__(self, job: Any, run_dir: Path, *, self_check: bool = True) -> None:
        from dk.pol.backends.rounded import clear_dead_modes

        clear_dead_modes()  # a previous Recorder on this thread that died mid-interval
        #: The run's ``ext.rounding``; a torch that names no release is refused before training.
        self.release = self.run_ext()
        self.job, self.run_dir, self.self_check = job, run_dir, self_check
        self.exts: dict[int, dict[str, Any]] = {}
        self._blob0: bytes | None = None  # interval 0's log: the first checkpoint's self-check
        self.written: list[Path] = []
        self._mode: RoundedMode | None = None
        self._active = False
        self._first_sig: tuple[Any, ...] | None = None
        self._step_mark = 0
        self._interval = 0
        self._ck0: Any = None

    def check_partial(self, partial: Any) -> None:
        """Refuse to continue ``partial`` (a :class:`dk.pol.resume.PartialRun`) recorded under
        another torch release (its sites may differ: SPEC VI §4) or by a dk whose commit lines
        do not name the logs; called before anything of the run is rewritten.

        Raises:
            JobMismatch: with one line saying which.
        """
        if not partial.job_named:
            raise JobMismatch(
                f"{self.run_dir}: the interrupted rounded run was recorded by an earlier dk, "
                "whose commit lines do not name the rounding logs: train into a new directory"
            )
        was, mine = (partial.run_ext or {}).get(RUN_KEY), self.release
        if was != mine:
            said = f"torch {was['torch']}" if isinstance(was, dict) and "torch" in was else None
            raise JobMismatch(
                f"{self.run_dir}: the interrupted run was recorded under "
                f"{said or 'an unnamed torch release'} and this is torch {mine['torch']}; one "
                "run's intervals must come from one release (SPEC VI §4): resume under the "
                "same release or train into a new directory"
            )

    def resume(self, partial: Any) -> None:
        """Continue ``partial`` (checked by :meth:`check_partial`): the logs its intervals'
        lines commit stay (:func:`dk.pol.resume.read_partial_run` checked them whole), the
        interval in progress is recorded afresh."""
        for iv in partial.intervals:
            ext = iv.ext[INTERVAL_KEY]
            self.exts[iv.index] = ext
            self.written.append(self.run_dir / ext["blob"])
        if not partial.intervals:  # interval 0 is redone: its self-check replays from ck 0
            self._ck0 = partial.last

    @staticmethod
    def run_ext() -> dict[str, Any]:
        """The run's ``ext.rounding`` (SPEC VI §4): the torch release that made the sites.

        Raises:
            JobMismatch: this torch's version names no release SPEC VI §4 accepts (a verifier
                would reject the manifest).
        """
        import torch

        ext = {"torch": torch_release(torch.__version__)}
        try:
            check_run_ext(ext, "ext.rounding")
        except ValueError as e:
            raise JobMismatch(
                f"rounded backend: torch {torch.__version__!r} is no release SPEC VI §4 can "
                f"name ({e}); record with a released torch"
            ) from None
        return ext

    def begin(self, interval: int) -> None:
        """Start recording interval ``interval`` (the mode becomes active)."""
        self._interval = interval
        self._mode = RoundedMode.record(
            job_id=self.job.job_id, interval=interval, tau_log2=self.job.rounding_tau_log2
        )
        self._mode.signatures = []
        self._step_mark = 0
        self._enter()

    def _enter(self) -> None:
        if self._mode is not None and not self._active:
            self._mode.__enter__()
            self._active = True

    def _exit(self) -> None:
        if self._mode is not None and self._active:
            self._active = False
            self._mode.__exit__(None, None, None)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The Recorder's own work, outside the log (resumes the current interval's mode)."""
        was = self._active
        self._exit()
        try:
            yield
        except BaseException:
            self.close()  # a refused loop leaves no mode behind on the thread's stack
            raise
        if was and self._mode is not None:
            self._enter()

    def end_step(self, step: int) -> None:
        """After each optimizer step (paused): its sites must be the first step's."""
        mode = self._mode
        assert mode is not None and mode.signatures is not None
        sig = tuple(mode.signatures[self._step_mark :])
        self._step_mark = len(mode.signatures)
        if self._first_sig is None:
            self._first_sig = sig
            return
        if sig != self._first_sig:
            diff = next(
                (i for i, (a, b) in enumerate(zip(sig, self._first_sig, strict=False)) if a != b),
                min(len(sig), len(self._first_sig)),
            )

            def site(sigs: tuple[Any, ...]) -> str:
                if diff >= len(sigs):
                    return "(end of step)"
                name, shape = sigs[diff]
                return f"{name} of shape {tuple(shape)}"

            shapes = diff < min(len(sig), len(self._first_sig)) and (
                sig[diff][0] == self._first_sig[diff][0]
            )
            raise JobMismatch(
                f"rounded backend: step {step} ran {len(sig)} rounding sites, the first step "
                f"{len(self._first_sig)}; site {diff} is {site(sig)} where the first step had "
                f"{site(self._first_sig)}. Every step must run the same operations on the same "
                "shapes (SPEC VI §5): "
                + (
                    "a model whose shapes depend on the data (boolean masks, nonzero) is not "
                    "covered"
                    if shapes
                    else "a loop that computes metrics must do so inside `with rec.paused():`"
                    " or from detached values outside the step"
                )
            )
        if len(mode.signatures) > 4096:  # keep memory flat on long intervals
            del mode.signatures[:]
            self._step_mark = 0

    def end(self, interval: int) -> bytes:
        """Finish interval ``interval``'s log (paused): write its blob, keep its ext."""
        assert self._mode is not None and interval == self._interval
        self._exit()
        log = self._mode.finish()
        self._mode = None
        blob = log.encode()
        ext = log_ext(blob)
        path = self.run_dir / ext["blob"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
        self.written.append(path)
        self.exts[interval] = ext
        if interval == 0:
            self._blob0 = blob
        return blob

    def snapped(self, index: int, step: int, ck: Any, dataset: Any) -> None:
        """A checkpoint was taken (paused): keep checkpoint 0; at 1, check interval 0."""
        if index == 0:
            self._ck0 = ck
        elif index == 1:
            start, self._ck0 = self._ck0, None
            self.check_first_interval(dataset, start, ck, (0, step))

    def check_first_interval(
        self, dataset: Any, start: Any, end: Any, steps: tuple[int, int]
    ) -> None:
        """Replay interval 0 with the job's canonical step under its log; it must give ``end``.

        Raises:
            JobMismatch: the user's loop is not the job's step (a verifier would reject it).
        """
        if not self.self_check:
            return
        from dk.errors import FormatError
        from dk.pol.checkpoint import checkpoint_root
        from dk.pol.replay import Replayer

        assert self._blob0 is not None
        try:
            got = Replayer(self.job, dataset).run(start, *steps, rounding_log=self._blob0)
        except FormatError as e:
            raise JobMismatch(
                f"rounded backend: replaying interval 0 under its own log fails ({e}); the loop "
                "does not compute the job's step (SPEC §12.4, VI §6)"
            ) from None
        if checkpoint_root(got) != checkpoint_root(end):
            raise JobMismatch(
                "rounded backend: interval 0 replayed with the job's step does not reach the "
                "recorded checkpoint 1; the loop does not compute the job's step "
                "(SPEC §12.4: loss, accumulation, clipping, optimizer)"
            )

    def close(self) -> None:
        """Leave the mode (after an error or at the end)."""
        self._exit()
        self._mode = None
