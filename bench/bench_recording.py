"""Recording overhead (issue 11 §5, issue 12 "Benchmarks"), each against the same loop without
recording: separate processes timed from outside, imports included (1, 2, 4), and the two
loops paired in one process (3).

1. ``dk train JOB`` / ``python -m bench.plain_train JOB``: a small CNN on the digits samples,
   exact mode on dk's kernels, ``DK_BENCH_STEPS`` (default 10,000) steps, k = 50 (target <=
   1.02) and k = 5 (target <= 1.10).
2. ``examples/tiny_lm`` (2-layer transformer LM, AdamW, warm-up + cosine, dropout, clipping,
   accumulation 2, bf16 autocast on CPU): the user's own loop with the Recorder attached /
   the same loop without it (:func:`lm_loop`), ``DK_BENCH_LM_STEPS`` (default 1,000) steps,
   k = 100 (target <= 1.02).
3. The loops of 2. paired in one process (:func:`lm_paired`): advanced by turns of 10 steps
   and compared interval by interval, so a neighbour's load slows both sides of a pair alike
   (two whole processes minutes apart swing by more than the 2 % target on a shared
   machine); the Recorder's set-up, ``finish`` and commit thread are counted on its side.
4. ``DK_BENCH_CALLGRIND=N`` (off by default; needs valgrind): the loops of 2. counted in
   instructions under callgrind at N and 2N steps, whole process (:func:`lm_instructions`).

``DK_BENCH_RECORDING`` picks the parts (default ``cnn,lm,lm-paired``).

Each figure of 1. and 2. is the minimum over ``DK_BENCH_REPS`` (default 3) runs, baseline and
candidate interleaved, after one warm-up run of each; wall and CPU (user + system of the child)
are both shown: on a shared machine the CPU ratio is the steadier one.
``DK_BENCH_RECORDING_BASE=DIR`` (another checkout's ``src``) adds that version's recorded run to
the interleaving, so two versions of the recorder are compared in one run (``old`` in the
output); ``DK_BENCH_VERBOSE=1`` prints every run with the load average at its end. Child
processes run with a bytecode cache (in the temporary directory) even where
``PYTHONDONTWRITEBYTECODE`` is set, as an installed package would: without it every process
recompiles dk's modules.
"""

from __future__ import annotations

import gc
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _env(tmp: Path, src_dir: str | None = None) -> dict[str, str]:
    src = src_dir or str(ROOT / "src")
    path = os.pathsep.join(p for p in (src, str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    return env


def timed(args: list[str], cwd: Path, src_dir: str | None = None) -> tuple[float, float]:
    """Run one process to completion (``src_dir``: dk's sources, default this tree's); its
    (wall, CPU) seconds."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    env = _env(cwd, src_dir)
    subprocess.run(args, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wc = wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if os.environ.get("DK_BENCH_VERBOSE"):
        print(f"    {args[2]} {args[-1]}: {wc[0]:.2f} s wall {wc[1]:.2f} s CPU   {_load()}")
    return wc


def _best(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return min(s[0] for s in samples), min(s[1] for s in samples)


def _load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def _verdict(value: float, target: float) -> str:
    return "met" if value <= target else "NOT met"


def compare(
    what: str,
    tmp: Path,
    plain: list[str],
    recorded: list[str],
    run_dir: Path,
    target: float,
    reps: int,
) -> None:
    """Time ``plain`` and ``recorded`` (which writes ``run_dir``) interleaved; print ratios."""
    old = os.environ.get("DK_BENCH_RECORDING_BASE")
    timed(plain, tmp)  # warm: kernel cache, bytecode cache, page cache
    shutil.rmtree(run_dir, ignore_errors=True)
    timed(recorded, tmp)
    if old:
        shutil.rmtree(run_dir, ignore_errors=True)
        timed(recorded, tmp, old)
    p, r, o = [], [], []
    for rep in range(reps):  # the order alternates, so neither side always runs first
        if rep % 2 == 0:
            p.append(timed(plain, tmp))
        shutil.rmtree(run_dir, ignore_errors=True)
        r.append(timed(recorded, tmp))
        if rep % 2 == 1:
            p.append(timed(plain, tmp))
        if old:
            shutil.rmtree(run_dir, ignore_errors=True)
            o.append(timed(recorded, tmp, old))
    (pw, pc), (rw, rc) = _best(p), _best(r)
    print(f"recording  {what}: plain {pw:.2f} s wall {pc:.2f} s CPU   recorded {rw:.2f} s wall "
          f"{rc:.2f} s CPU")  # fmt: skip
    verdicts = f"wall {_verdict(rw / pw, target)}, CPU {_verdict(rc / pc, target)}"
    print(f"  ratio wall {rw / pw:.3f}   CPU {rc / pc:.3f}   (target <= {target}: {verdicts})"
          f"   {_load()}")  # fmt: skip
    pairs = sorted(b[1] / a[1] for a, b in zip(p, r, strict=True))
    print(f"  CPU ratio of each rep's pair (adjacent runs, order alternating): median "
          f"{statistics.median(pairs):.3f}, {pairs[0]:.3f}..{pairs[-1]:.3f}")  # fmt: skip
    if o:
        ow, oc = _best(o)
        print(f"  old ({old}): ratio wall {ow / pw:.3f}   CPU {oc / pc:.3f}")


def cnn(tmp: Path, steps: int, reps: int) -> None:
    """Issue 11 §5: ``dk train`` / the same steps without recording, k = 50 and k = 5."""
    import numpy as np

    from dk.pol import default_job
    from dk.pol.data import load_dataset

    d = load_dataset(default_job(steps=1))  # the built-in digits samples, as an .npz file
    np.savez(tmp / "digits.npz", X=np.asarray(d.X), y=np.asarray(d.y))
    for k, target in ((50, 1.02), (5, 1.10)):
        job = default_job(arch="cnn", steps=steps, interval=k, dataset="npz",
                          data_path="digits.npz", base_dir=tmp)  # fmt: skip
        path = tmp / f"cnn_k{k}.toml"
        path.write_text(job.to_toml())
        compare(
            f"small CNN, exact (dk kernels), {steps} steps, k={k}",
            tmp,
            [PY, "-m", "bench.plain_train", str(path)],
            [PY, "-m", "dk.cli", "train", str(path), "--out", f"run{k}"],
            tmp / f"run{k}",
            target,
            reps,
        )


def lm_job(work: Path, steps: int, interval: int = 100) -> Any:
    """The tiny_lm example's job (its consumer), with a fixed tolerance (no calibration run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tiny_lm", ROOT / "examples/tiny_lm/example.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example.consumer(work, steps=steps, interval=interval, text_bytes=100_000, tolerance=0.2)


def lm_steps(work: Path, record: bool) -> Iterator[int]:
    """The tiny_lm example's own training loop (examples/tiny_lm/example.py ``worker``), with
    the Recorder (its three ``# dk`` lines) or without it (the job's batches, in the job's
    order, from the same data and sampler; no seeding, no checks, nothing written), one
    optimizer step at a time: yields 0 once set up (model, optimizer, schedule, data; with
    the Recorder, attached), then the number of each step done; the last ``next`` (with the
    Recorder, ``finish``) ends it. Both clip the gradients once by the job's global norm:
    without the Recorder the loop calls ``clip_grad_norm_``; with it the recorded
    ``opt.step()`` does (the example's loop leaves the job's clipping to dk)."""
    import math

    import torch
    import torch.nn.functional as F

    from dk.pol import Recorder, build_model, load_job

    job = load_job(work / "job.toml")
    t = job.train
    torch.set_num_threads(1)
    model = build_model(job)
    opt = torch.optim.AdamW(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]),
                            weight_decay=t["weight_decay"], foreach=False)  # fmt: skip
    warm, total, floor = t["warmup_steps"], job.steps, t["min_lr"] / t["lr"]

    def shape(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, shape)
    acc = t["accumulation"]
    if record:
        rec = Recorder(job, work / "run")
        model, opt, loader = rec.attach(model=model, optimizer=opt, scheduler=sched)
        autocast: Any = rec.autocast
    else:
        from dk.pol.data import load_dataset
        from dk.pol.sampler import job_sampler
        from dk.pol.torch_adapter import job_batch

        ds = load_dataset(job)
        sampler = job_sampler(job, len(ds))
        loader = (mb for s in range(job.steps) for mb in zip(
            *(z.chunk(acc) for z in job_batch(job, ds, sampler, s)), strict=True))  # fmt: skip

        def autocast() -> Any:
            return torch.autocast(device_type="cpu", dtype=torch.bfloat16)

    yield 0
    for i, (x, y) in enumerate(loader):
        with autocast():
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1).long())
        (loss / acc).backward()
        if i % acc == acc - 1:
            if not record:  # with the Recorder, the job's clipping is dk's (in opt.step())
                torch.nn.utils.clip_grad_norm_(model.parameters(), t["clip_norm"])
            opt.step()
            sched.step()
            opt.zero_grad()
            yield (i + 1) // acc
    if record:
        rec.finish()


def lm_loop(work: Path, record: bool) -> None:
    """:func:`lm_steps` to the end, in one go."""
    for _ in lm_steps(work, record):
        pass


class _GcClock:
    """This thread's CPU inside Python's cycle collector (``gc.callbacks``): the collector is
    shared by both loops of :func:`lm_paired`, so its time is charged to the recorded side
    whichever turn it lands in."""

    def __init__(self) -> None:
        self.total, self._t0 = 0.0, 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.thread_time()
        else:
            self.total += time.thread_time() - self._t0


def _advance(steps: Iterator[int], n: int | None, gc_clock: _GcClock | None = None) -> float:
    """CPU seconds of this thread to take ``n`` more steps of ``steps`` (None: to its end),
    less the cycle collector's (``gc_clock``)."""
    c0, g0 = time.thread_time(), gc_clock.total if gc_clock else 0.0
    if n is None:
        for _ in steps:
            pass
    else:
        for _ in range(n):
            next(steps)
    return time.thread_time() - c0 - ((gc_clock.total - g0) if gc_clock else 0.0)


def lm_paired(tmp: Path, steps: int, interval: int = 100, chunk: int = 10) -> tuple[float, float]:
    """Issue 12, paired in one process: the recorded and the plain loop of :func:`lm_steps`
    advanced by turns of ``chunk`` steps, the first of each turn alternating, and summed per
    interval (``interval`` steps, a multiple of ``chunk``); each turn's CPU is this thread's.

    First, uncounted, a plain loop is set up and takes one step: the imports and torch's
    first-step costs, which both sides need (in their own processes each pays them; here only
    the first would). The recorded side then carries its own set-up (``Recorder``,
    ``attach``, checkpoint 0), ``finish`` (the last commits, one sync, ``run.json``), all
    the CPU of every other thread of the process (the Recorder's commit thread; torch has one
    thread) and the cycle collector's CPU whichever turn it lands in (:class:`_GcClock`).
    Returns (median of the per-interval ratios, each with its share of those, ratio of the
    totals).

    Neighbours on a shared machine slow both sides of a pair alike, so the per-pair ratio is
    far steadier than two whole processes minutes apart. The imports only the Recorder
    needs are not in it: whole-process instructions are :func:`lm_instructions`'s."""
    work = tmp / "lm-paired"
    lm_job(work, steps, interval)
    shutil.rmtree(work / "run", ignore_errors=True)
    warm = lm_steps(work, False)  # imports and torch's first step, which both sides need
    _advance(warm, 2)  # set-up and one step
    warm.close()
    clock = _GcClock()
    gc.callbacks.append(clock)
    try:
        c0, main0 = time.process_time(), time.thread_time()
        rec, plain = lm_steps(work, True), lm_steps(work, False)
        fixed_r = _advance(rec, 1, clock)
        fixed_p = _advance(plain, 1, clock)
        pairs = []
        for _ in range(steps // interval):
            turn = {"r": 0.0, "p": 0.0}
            for j in range(interval // chunk):
                order = [(rec, "r"), (plain, "p")][:: 1 if j % 2 == 0 else -1]
                for it, who in order:
                    turn[who] += _advance(it, chunk, clock)
            pairs.append((turn["r"], turn["p"]))
        fixed_r += _advance(rec, None, clock) + clock.total  # every collection: the Recorder's
        fixed_p += _advance(plain, None, clock)
        other = (time.process_time() - c0) - (time.thread_time() - main0)
    finally:
        gc.callbacks.remove(clock)
    tr = fixed_r + sum(r for r, _ in pairs) + max(0.0, other)
    tp = fixed_p + sum(p for _, p in pairs)
    share = (fixed_r - fixed_p + max(0.0, other)) / len(pairs)
    median = statistics.median((r + share) / p for r, p in pairs)
    print(f"recording  tiny_lm, paired in one process, {steps} steps, k={interval}: "
          f"plain {tp:.2f} s CPU   recorded {tr:.2f} s CPU (set-up and finish "
          f"{fixed_r:.2f} s vs {fixed_p:.2f} s, of which the cycle collector "
          f"{clock.total:.2f} s; other threads {other:.2f} s)")  # fmt: skip
    spread = sorted(r / p for r, p in pairs)
    print(f"  ratio of totals {tr / tp:.3f}   median of {len(pairs)} interval pairs "
          f"{median:.3f} (each with its share of the fixed and other-thread CPU; "
          f"bare pairs {spread[0]:.3f}..{spread[-1]:.3f})   (target <= 1.02: totals "
          f"{_verdict(tr / tp, 1.02)}, median {_verdict(median, 1.02)})   {_load()}")  # fmt: skip
    return median, tr / tp


def lm(tmp: Path, steps: int, reps: int) -> None:
    """Issue 12: the Recorder on the tiny_lm example's own loop / the loop without it, k=100."""
    work = tmp / "lm"
    lm_job(work, steps)
    loop = [PY, "-m", "bench.bench_recording", "lm-loop", str(work)]
    compare(f"tiny_lm (user's loop, bf16, accumulation 2), {steps} steps, k=100", tmp,
            [*loop, "plain"], [*loop, "record"], work / "run", 1.02, reps)  # fmt: skip


def instructions(args: list[str], cwd: Path) -> int:
    """User-space instructions of one process and its threads, counted by callgrind (the same
    count whatever the machine's load)."""
    out = cwd / "callgrind.out"
    log = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *args],
        cwd=cwd, env=_env(cwd), check=True, capture_output=True, text=True,
    ).stderr  # fmt: skip
    out.unlink(missing_ok=True)
    return parse_collected(log)


def parse_collected(log: str) -> int:
    """The ``Collected : N`` count of a callgrind log.

    >>> parse_collected("==7== Events : Ir  ==7== Collected : 26926367963")
    26926367963
    """
    for line in log.splitlines():
        if "Collected :" in line:
            return int(line.split("Collected :")[1].split()[0])
    raise ValueError("no 'Collected' line in the callgrind log")


def lm_instructions(tmp: Path, steps: int, short: int) -> None:
    """Issue 12, counted: the tiny_lm loops of :func:`lm` at ``short`` and ``2·short`` steps
    under callgrind, split into a fixed count and a count per step, and the whole-process
    ratio extrapolated to ``steps`` (``DK_BENCH_CALLGRIND=SHORT``; about 10 minutes a run at
    100 steps). Time on a shared machine swings more than the 2 % target; instructions do not,
    though they weigh a cache miss or a slow instruction like any other."""
    counts: dict[tuple[str, int], int] = {}
    for n in (short, 2 * short):
        work = tmp / f"lm-ir{n}"
        lm_job(work, n)
        for mode in ("plain", "record"):
            args = [PY, "-m", "bench.bench_recording", "lm-loop", str(work), mode]
            if n == short:  # warm, natively: the bytecode cache (else compiling is counted)
                shutil.rmtree(work / "run", ignore_errors=True)
                timed(args, tmp)
            shutil.rmtree(work / "run", ignore_errors=True)
            counts[mode, n] = instructions(args, tmp)
    line = {}
    for mode in ("plain", "record"):
        per = (counts[mode, 2 * short] - counts[mode, short]) / short
        line[mode] = (counts[mode, short] - per * short, per)
        print(f"instructions  tiny_lm {mode:6s}: {line[mode][0] / 1e9:.3f} G fixed + "
              f"{per / 1e6:.2f} M per step")  # fmt: skip
    (fp, pp), (fr, pr) = line["plain"], line["record"]
    at_short = counts["record", short] / counts["plain", short]
    at_steps = (fr + pr * steps) / (fp + pp * steps)
    print(
        f"  ratio whole process: {at_short:.4f} at {short} steps, {at_steps:.4f} at {steps} "
        f"steps (target <= 1.02 on time: {_verdict(at_steps, 1.02)} in instructions)"
    )


def main() -> None:
    reps = int(os.environ.get("DK_BENCH_REPS", "3"))
    steps = int(os.environ.get("DK_BENCH_STEPS", "10000"))
    n_lm = int(os.environ.get("DK_BENCH_LM_STEPS", "1000"))
    tmp = Path(tempfile.mkdtemp(prefix="dk-bench-rec-"))
    try:
        which = os.environ.get("DK_BENCH_RECORDING", "cnn,lm,lm-paired").split(",")
        if "cnn" in which:
            cnn(tmp, steps, reps)
        if "lm" in which:
            lm(tmp, n_lm, reps)
        if "lm-paired" in which:
            lm_paired(tmp, n_lm)
        short = int(os.environ.get("DK_BENCH_CALLGRIND", "0"))
        if short > 0 and shutil.which("valgrind"):
            lm_instructions(tmp, n_lm, short)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "lm-loop":
        lm_loop(Path(sys.argv[2]), record=sys.argv[3] == "record")
    else:
        main()
