"""Whole-process benchmarks (issue 11): separate processes timed from outside, imports included.

1. Start-up: ``dk verify --help`` (target <= 0.3 s).
2. Recording overhead: ``dk train JOB`` / ``python -m bench.plain_train JOB`` (the same steps with
   no recording), a small CNN on the digits samples in exact mode on dk's kernels, 10,000 steps,
   k = 50 (target <= 1.02) and k = 5 (target <= 1.10).
3. Verification cost: ``dk verify --integrity challenged`` / ``dk train`` on the k = 5 run
   (2,000 intervals), s samples for 99 % detection of 10 % skipped intervals, top-q 0. The floor
   is s/m; target <= 1.1 x s/m. Also printed: the fixed cost (from the same verify with one
   sample) and the training length at which the target would be met with that fixed cost.

Each figure is the minimum over ``DK_BENCH_REPS`` (default 3) runs, baseline and candidate
interleaved; wall time and CPU time (user + system of the child) are both shown because this
machine may be shared: on a loaded machine the CPU ratio is the steadier one. The data is the
``digits`` samples written to an ``.npz`` file, so neither process pays scikit-learn's import.
``DK_BENCH_STEPS`` (default 10,000) shortens the runs.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _env() -> dict[str, str]:
    src = str(ROOT / "src")
    path = os.pathsep.join(p for p in (src, str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


def timed(args: list[str], cwd: Path) -> tuple[float, float]:
    """Run one process to completion; its (wall, CPU) seconds."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(args, cwd=cwd, env=_env(), check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def _best(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return min(s[0] for s in samples), min(s[1] for s in samples)


def _load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def _verdict(value: float, target: float) -> str:
    return "met" if value <= target else "NOT met"


def startup(tmp: Path, reps: int) -> None:
    runs = [timed([PY, "-m", "dk.cli", "verify", "--help"], tmp) for _ in range(max(reps, 5))]
    wall, cpu = _best(runs)
    print(f"start-up  dk verify --help: {wall:.3f} s wall, {cpu:.3f} s CPU   (target <= 0.3 s: "
          f"{_verdict(wall, 0.3)})   {_load()}")  # fmt: skip


def _jobs(tmp: Path, steps: int) -> dict[int, Path]:
    import numpy as np

    from dk.pol import default_job
    from dk.pol.data import _digits

    d = _digits()
    np.savez(tmp / "digits.npz", X=d.X, y=d.y)
    out = {}
    for k in (50, 5):
        job = default_job(arch="cnn", steps=steps, interval=k, dataset="npz",
                          data_path="digits.npz", base_dir=tmp)  # fmt: skip
        out[k] = tmp / f"cnn_k{k}.toml"
        out[k].write_text(job.to_toml())
    return out


def recording(tmp: Path, job: Path, k: int, target: float, reps: int) -> tuple[float, float]:
    """Whole-process recording overhead; returns dk train's best (wall, CPU)."""
    timed([PY, "-m", "bench.plain_train", str(job)], tmp)  # warm the kernel cache and page cache
    plain, rec = [], []
    for _ in range(reps):
        plain.append(timed([PY, "-m", "bench.plain_train", str(job)], tmp))
        shutil.rmtree(tmp / f"run{k}", ignore_errors=True)
        rec.append(timed([PY, "-m", "dk.cli", "train", str(job), "--out", f"run{k}"], tmp))
    (pw, pc), (rw, rc) = _best(plain), _best(rec)
    print(f"recording  small CNN, exact (dk kernels), k={k}: plain {pw:.2f} s wall {pc:.2f} s CPU"
          f"   dk train {rw:.2f} s wall {rc:.2f} s CPU")  # fmt: skip
    verdicts = f"wall {_verdict(rw / pw, target)}, CPU {_verdict(rc / pc, target)}"
    print(f"  ratio wall {rw / pw:.3f}   CPU {rc / pc:.3f}   (target <= {target}: {verdicts})"
          f"   {_load()}")  # fmt: skip
    return rw, rc


def verification(tmp: Path, job: Path, train: tuple[float, float], reps: int) -> None:
    from dk.crypto.keys import SigningKey
    from dk.pol.job import load_job
    from dk.verifier.challenge import samples_for

    m = load_job(job).num_intervals
    s = samples_for(m, 0.10, 0.99)
    SigningKey(bytes(range(32))).save(tmp / "w.key")
    subprocess.run([PY, "-m", "dk.cli", "prove", "run5", "--job", str(job), "--key", "w.key",
                    "--out", "bundle5"], cwd=tmp, env=_env(), check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    base = [PY, "-m", "dk.cli", "verify", "bundle5", "--job", str(job), "--integrity",
            "challenged", "--beacon", "00" * 32, "--topq", "0", "--json"]  # fmt: skip
    full, fixed = [], []
    for _ in range(reps):
        full.append(timed([*base, "--samples", str(s)], tmp))
        fixed.append(timed([*base, "--samples", "1"], tmp))
    (vw, vc), (w1, c1) = _best(full), _best(fixed)
    # fixed cost: the one-sample run less one sample's share of the s-sample run
    fw, fc = (w1 - (vw - w1) / (s - 1), c1 - (vc - c1) / (s - 1)) if s > 1 else (w1, c1)
    floor, target = s / m, 1.1 * s / m
    print(f"verification  {m} intervals, s={s} (99% detection at 10% skipped), floor s/m "
          f"{floor:.4f}, target <= {target:.4f}")  # fmt: skip
    for name, v, f, t in (("wall", vw, fw, train[0]), ("CPU", vc, fc, train[1])):
        variable = (v - f) / t
        need = f / (target - variable) if target > variable else float("inf")
        print(f"  {name:4s} verify {v:.2f} s / train {t:.2f} s = {v / t:.4f} "
              f"({_verdict(v / t, target)})   fixed cost {f:.2f} s, variable part "
              f"{variable:.4f} x train; target met from ~{need:.0f} s of training")  # fmt: skip
    print(f"  {_load()}")


def main() -> None:
    reps = int(os.environ.get("DK_BENCH_REPS", "3"))
    steps = int(os.environ.get("DK_BENCH_STEPS", "10000"))
    tmp = Path(tempfile.mkdtemp(prefix="dk-bench-proc-"))
    try:
        startup(tmp, reps)
        jobs = _jobs(tmp, steps)
        recording(tmp, jobs[50], 50, 1.02, reps)
        train5 = recording(tmp, jobs[5], 5, 1.10, reps)
        verification(tmp, jobs[5], train5, reps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
