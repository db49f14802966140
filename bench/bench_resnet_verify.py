"""Verification cost on ``examples/resnet_images`` (issue 12): whole process, target <= 0.03.

The example's own consumer, model file and worker loop (``examples/resnet_images/example.py``:
a ResNet with BatchNorm, SGD with Nesterov momentum, step decay, random crop and flip, tolerant
mode on PyTorch), at a size two shared cores finish in a few minutes: ``DK_BENCH_RESNET_STEPS``
steps (default 2,000) with a checkpoint after every step (k = 1), so the run has 2,000
intervals, on 16x16 images (the digits folder written at ``size=16``; the model is the
example's, width 8).

Timed as separate processes from outside, imports included (CPU = user + system):

* train: the example's ``worker()`` (its loop with the Recorder, then ``prove_run``), less a
  separate ``dk prove`` of the same run, so the figure is the recorded training alone;
* verify: ``dk verify --integrity challenged`` with s samples for 99 % detection of 10 %
  skipped intervals, top-q 0. Also printed: the fixed cost (from the same verification with one
  sample), split into start-up and imports before ``verify_bundle`` and the CPU inside it (where
  torch is imported: the consumer's model is built there), next to the floors no dk change
  removes (Python + NumPy, ``import torch``), and the training length from which the target
  would be met with that fixed cost.

Each verify figure is the minimum over ``DK_BENCH_REPS`` (default 3) runs; training runs once.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench.bench_process import PY, ROOT, _best, _load, _verify_runs, report_verification, timed

EXAMPLE = ROOT / "examples" / "resnet_images"
TARGET = 0.03


def _worker(work: Path) -> tuple[float, float]:
    code = (
        f"import sys; sys.path.insert(0, {str(EXAMPLE)!r}); from pathlib import Path; "
        f"from example import worker; worker(Path({str(work)!r}))"
    )
    return timed([PY, "-c", code], work)


def main() -> None:
    steps = int(os.environ.get("DK_BENCH_RESNET_STEPS", "2000"))
    reps = int(os.environ.get("DK_BENCH_REPS", "3"))
    work = Path(tempfile.mkdtemp(prefix="dk-bench-resnet-"))
    try:
        sys.path.insert(0, str(EXAMPLE))
        from example import consumer

        from dk.crypto.keys import SigningKey
        from dk.pol.data.synth import digits_image_folder
        from dk.verifier.challenge import samples_for

        digits_image_folder(work / "images", n=512, size=16)
        job = consumer(work, images=512, steps=steps, interval=1)
        SigningKey(bytes(range(32))).save(work / "w.key")
        m = job.num_intervals
        s = samples_for(m, 0.10, 0.99)
        tw, tc = _worker(work)
        pw, pc = timed(
            [PY, "-m", "dk.cli", "prove", "run", "--job", "job.toml", "--key", "w.key", "--out",
             "bundle2"], work)  # fmt: skip
        train = (tw - pw, tc - pc)
        print(f"resnet_images  {steps} steps, k=1 ({m} intervals), 16x16 images, tolerant: "
              f"worker {tw:.1f} s wall {tc:.1f} s CPU, of which prove {pw:.2f} s wall "
              f"{pc:.2f} s CPU   {_load()}")  # fmt: skip
        base = [PY, "-m", "dk.cli", "verify", "bundle", "--job", "job.toml", "--integrity",
                "challenged", "--beacon", "00" * 32, "--topq", "0", "--json"]  # fmt: skip
        runs = _verify_runs(base, work, s, reps)
        py = _best([timed([PY, "-c", "import numpy"], work) for _ in range(reps)])
        pt = _best([timed([PY, "-c", "import torch"], work) for _ in range(reps)])
        floors = {"python + numpy": py[1], "import torch (less numpy)": pt[1] - py[1]}
        print("verification  dk verify --integrity challenged / the worker's recorded training, "
              "whole process")  # fmt: skip
        report_verification(m, s, 1, TARGET, train, runs, floors, relative=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
