"""Rounded jobs through the real Recorder / prove / verify path across thread counts (issue 13).

For the ResNet-with-BatchNorm example (the user's own loop with the Recorder) and the tiny
transformer LM example (``dk train``, AdamW, warm-up + cosine, clipping, accumulation 2, dk's
seeded dropout), at CI size, in float32 and with the forward pass under bfloat16 autocast:
train on 2 threads and on 1 thread in separate processes, prove, and verify each bundle in a
process with the other thread count. The final checkpoint roots
must be equal and each verification must accept; plain torch on the same job must give
different roots on 1 and 2 threads (so the test can fail, and the parallel path ran), except the
bf16 ResNet, whose plain run happens to agree across thread counts at this size.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .bundle_worker import make_job
from .conftest import SRC

WORKER = Path(__file__).with_name("bundle_worker.py")
ROOT = SRC.parent


def _run(threads: int, work: Path, example: str, action: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(WORKER), str(threads), str(work), example, action],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if proc.returncode != 0:  # pragma: no cover - the failure report
        pytest.fail(f"{example} {action} ({threads} threads) failed:\n{proc.stderr[-4000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("example", ["resnet", "lm"])
def test_train_two_threads_verify_one_and_reverse(
    example: str, precision: str, tmp_path: Path
) -> None:
    job = make_job(tmp_path, example, precision)
    assert job.train["precision"] == precision
    _run(2, tmp_path, example, "train,plain")
    _run(1, tmp_path, example, "train,plain,verify")  # verifies the 2-thread bundle on 1 thread
    _run(2, tmp_path, example, "verify")  # and the 1-thread bundle on 2 threads

    def read(name: str) -> str:
        return (tmp_path / name).read_text()

    if (example, precision) != ("resnet", "bf16"):  # plain torch is not reproducible; the
        # bf16 ResNet at CI size happens to give one root on 1 and 2 threads (measured)
        assert read("plain-1.root") != read("plain-2.root")
    assert read("rounded-1.root") == read("rounded-2.root")
    assert read("verify-1.txt") == "accept"
    assert read("verify-2.txt") == "accept"
