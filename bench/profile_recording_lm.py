"""Where the Recorder's time goes in the tiny_lm loop (issue 12, "Recording overhead").

    python -m bench.profile_recording_lm [STEPS]

Builds the tiny_lm example's job (as ``bench.bench_recording`` does), then runs its own loop
(:func:`bench.bench_recording.lm_loop`) twice in this process: without the Recorder, then with
it and the Recorder's per-step methods wrapped in timers. Prints the main thread's CPU time of
each loop and, per Recorder method, its mean CPU time per call (``time.thread_time_ns``: the
time the thread ran, not time it waited for a core; each timer call itself costs about 1 us
on a slow virtual clock). A diagnostic, not a benchmark with a target: the ratio that counts
is ``python -m bench recording``'s, whole process.
"""

from __future__ import annotations

import collections
import functools
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TIMED = (
    "_on_forward",  # forward pre-hook: checks, per-micro-batch seeding (SPEC §8.3)
    "_step_seed",  # (inside _on_forward) the seed block derivation
    "_record_loss",  # forward hook: the job's loss on the micro-batch's logits (SPEC §11.7)
    "_check_step_inputs",  # optimizer.step(): forwards counted, lr checked and set
    "_clip_gradients",  # the job's clipping by global norm
    "_check_finite",  # the first non-finite update stops recording
    "_on_step",  # step count, checkpoint every k steps
    "_snap",  # (inside _on_step) the snapshot handed to the writer thread
)


def _wrap(cls: Any, name: str, spent: dict[str, int], calls: collections.Counter[str]) -> None:
    f = getattr(cls, name)

    @functools.wraps(f)
    def timed(*a: Any, **k: Any) -> Any:
        t = time.thread_time_ns()
        try:
            return f(*a, **k)
        finally:
            spent[name] += time.thread_time_ns() - t
            calls[name] += 1

    setattr(cls, name, timed)


def main(argv: list[str]) -> None:
    from bench.bench_recording import lm_job, lm_loop
    from dk.pol import recorder

    steps = int(argv[0]) if argv else 1000
    tmp = Path(tempfile.mkdtemp(prefix="dk-prof-rec-"))
    try:
        work = tmp / "lm"
        lm_job(work, steps)
        t0 = time.thread_time()
        lm_loop(work, record=False)
        plain = time.thread_time() - t0
        spent: dict[str, int] = collections.defaultdict(int)
        calls: collections.Counter[str] = collections.Counter()
        for name in TIMED:
            _wrap(recorder.Recorder, name, spent, calls)
        t0 = time.thread_time()
        lm_loop(work, record=True)
        rec = time.thread_time() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"tiny_lm, {steps} steps: main-thread CPU plain {plain:.2f} s, recorded {rec:.2f} s "
          f"(ratio {rec / plain:.3f}, timers included)")  # fmt: skip
    for name in TIMED:
        if calls[name]:
            per = spent[name] / calls[name] / 1e3
            print(f"  {name:20s} {per:8.1f} us x {calls[name]:5d} = {spent[name] / 1e9:.3f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
