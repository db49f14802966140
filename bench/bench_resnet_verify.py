"""Verification cost on ``examples/resnet_images`` (issue 12): whole process, target <= 0.03.

**Headline**: verify CPU / train CPU on the run a user of the example would make, at the
issue's size: the example's own consumer, model file and worker loop
(``examples/resnet_images/example.py``: a width-8 ResNet with BatchNorm, SGD with Nesterov
momentum, step decay, random crop and flip, tolerant mode on PyTorch, all 1,797 images, batch
32, a checkpoint every **50** steps as the example's job has it), trained for 100,000 steps,
so the run has m = 2,000 intervals, and verified with s samples for 99 % detection of 10 %
skipped intervals (top-q 0).

Choices, and why:

* interval 50 is the example's own: a user picks the checkpoint interval for the recording
  overhead and the storage, not to flatter verification (the previous version of this bench
  checkpointed every step, which nobody would).
* The one knob turned down is the image size, which the example's data step exposes: the
  digits at their own 8x8 instead of upscaled to the CIFAR shape 32x32 (the model is
  size-agnostic). It makes every step, trained or replayed, cheaper alike, so it leaves the
  variable part of the ratio unchanged and makes the verifier's fixed cost weigh more (the
  harder case for the target), while training 100,000 steps stays within ~30 min of CPU.
* The tolerance is the one the consumer's job init calibrates (``dk calibrate``); if the
  calibration refuses (a cheap cheat lands inside it), the bench pins its recommendation as
  ``dk calibrate --force`` would and says so: the tolerance is a threshold on the replay's
  distance and changes nothing that is replayed or read.

Timed as separate processes from outside, imports included (CPU = user + system):

* train: the example's ``worker()`` (its loop with the Recorder, then ``prove_run``), less a
  separate ``dk prove`` of the same run, so the figure is the recorded training alone (once:
  it is the long part);
* verify: ``dk verify --integrity challenged`` with s samples and with one sample, alternated,
  ``DK_BENCH_REPS`` times (default 2), the minimum of each. The fixed cost is the one-sample
  run less one sample; the variable part is per sample (the difference of the two runs over
  s - 1), next to s/m x train, its floor. Also printed: the floors no dk change removes
  (Python + NumPy, ``import torch``) and the training length from which the target is met
  with that fixed cost.

Environment: ``DK_BENCH_RESNET_STEPS`` (default 100,000) shortens the run: then m < 2,000 and
the ratio printed is not the headline (the bench says so; the fixed cost, the per-sample cost
and the length from which the target is met still are). ``DK_BENCH_RESNET_SIZE`` (default 8)
sets the image size (a multiple of 8). ``DK_BENCH_RESNET_DIR`` keeps the trained run in that
directory and reuses it when its settings match, so a second bench run only verifies.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench.bench_process import (
    PY,
    ROOT,
    VerifyRuns,
    _best,
    _load,
    report_verification,
    timed,
)

EXAMPLE = ROOT / "examples" / "resnet_images"
TARGET = 0.03
HEADLINE_INTERVALS = 2000
INTERVAL = 50  # the example's own job (``consumer``'s default)


def _worker(work: Path) -> tuple[float, float]:
    code = (
        f"import sys; sys.path.insert(0, {str(EXAMPLE)!r}); from pathlib import Path; "
        f"from example import worker; worker(Path({str(work)!r}))"
    )
    return timed([PY, "-c", code], work)


def _consumer(work: Path, steps: int, size: int) -> tuple[object, str]:
    """The example's job for ``steps`` steps on ``size`` x ``size`` images; its tolerance's
    source."""
    sys.path.insert(0, str(EXAMPLE))
    from example import consumer

    from dk.pol.calibrate import UnsafeTolerance
    from dk.pol.data.synth import digits_image_folder

    if not (work / "images").exists():
        digits_image_folder(work / "images", size=size)  # all 1,797 images, as the example
    try:
        return consumer(work, steps=steps, interval=INTERVAL), "calibrated"
    except UnsafeTolerance as e:  # pinned as `dk calibrate --force` would
        tol = e.calibration.recommended_tolerance
        note = f"calibration refused ({e}); pinned {tol:.3g} as --force would"
        return consumer(work, steps=steps, interval=INTERVAL, tolerance=tol), note


def _train(work: Path, steps: int, size: int) -> tuple[object, tuple[float, float], str]:
    """Write the job and train it (or reuse a kept run with the same settings)."""
    from dk.crypto.keys import SigningKey
    from dk.pol.job import load_job

    record = work / "bench_train.json"
    settings = {"steps": steps, "size": size, "interval": INTERVAL}
    if record.exists() and (work / "bundle").is_dir():
        kept = json.loads(record.read_text())
        if kept["settings"] == settings:
            job = load_job(work / "job.toml")
            return job, (kept["train_wall"], kept["train_cpu"]), kept["tolerance"] + " (kept run)"
    for old in ("run", "bundle", "bundle2", "job.toml"):
        p = work / old
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    job, tol_note = _consumer(work, steps, size)
    SigningKey(bytes(range(32))).save(work / "w.key")
    tw, tc = _worker(work)
    pw, pc = timed(
        [PY, "-m", "dk.cli", "prove", "run", "--job", "job.toml", "--key", "w.key", "--out",
         "bundle2"], work)  # fmt: skip
    train = (tw - pw, tc - pc)
    print(f"  worker {tw:.1f} s wall {tc:.1f} s CPU, of which prove {pw:.2f} s wall "
          f"{pc:.2f} s CPU   {_load()}")  # fmt: skip
    record.write_text(json.dumps({"settings": settings, "train_wall": train[0],
                                  "train_cpu": train[1], "tolerance": tol_note}))  # fmt: skip
    return job, train, tol_note


def _verify_alternated(work: Path, s: int, reps: int) -> VerifyRuns:
    """Whole-process ``dk verify`` with ``s`` samples and with one, alternated."""
    base = [PY, "-m", "dk.cli", "verify", "bundle", "--job", "job.toml", "--integrity",
            "challenged", "--beacon", "00" * 32, "--topq", "0", "--json"]  # fmt: skip
    full, one, inside = [], [], []
    for _ in range(reps):
        full.append(timed([*base, "--samples", str(s)], work, stdout=work / "full.json"))
        one.append(timed([*base, "--samples", "1"], work, stdout=work / "one.json"))
        for name in ("full.json", "one.json"):
            rep = json.loads((work / name).read_text())
            assert rep["verdict"] == "accept", rep["findings"]
        inside.append(float(json.loads((work / "one.json").read_text())["figures"]["verify_cpu_s"]))
    (fw, fc), (ow, oc) = _best(full), _best(one)
    per = ((fw - ow) / (s - 1), (fc - oc) / (s - 1))
    return VerifyRuns((fw, fc), (ow, oc), min(inside), per)


def main() -> None:
    steps = int(os.environ.get("DK_BENCH_RESNET_STEPS", str(INTERVAL * HEADLINE_INTERVALS)))
    size = int(os.environ.get("DK_BENCH_RESNET_SIZE", "8"))
    reps = int(os.environ.get("DK_BENCH_REPS", "2"))
    kept = os.environ.get("DK_BENCH_RESNET_DIR")
    work = Path(kept) if kept else Path(tempfile.mkdtemp(prefix="dk-bench-resnet-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        from dk.verifier.challenge import samples_for

        print(f"resnet_images  the example's job: {steps} steps, interval {INTERVAL}, "
              f"{size}x{size} images, tolerant (PyTorch)")  # fmt: skip
        job, train, tol_note = _train(work, steps, size)
        m = job.num_intervals  # type: ignore[attr-defined]
        s = samples_for(m, 0.10, 0.99)
        headline = m >= HEADLINE_INTERVALS
        print(f"  train (recorded, less prove) {train[0]:.1f} s wall {train[1]:.1f} s CPU = "
              f"{train[1] / steps * 1e3:.1f} ms CPU per step; tolerance: {tol_note}")  # fmt: skip
        runs = _verify_alternated(work, s, max(reps, 1))
        py = _best([timed([PY, "-c", "import numpy"], work) for _ in range(reps)])
        pt = _best([timed([PY, "-c", "import torch"], work) for _ in range(reps)])
        floors = {"python + numpy": py[1], "import torch (less numpy)": pt[1] - py[1]}
        label = (
            "HEADLINE (the example's job, m >= 2,000)"
            if headline
            else f"NOT the headline: m = {m} < {HEADLINE_INTERVALS} (DK_BENCH_RESNET_STEPS)"
        )
        print(f"verification  dk verify --integrity challenged / the worker's recorded "
              f"training, whole process: {label}")  # fmt: skip
        report_verification(m, s, INTERVAL, TARGET, train, runs, floors, relative=False)
    finally:
        if not kept:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
