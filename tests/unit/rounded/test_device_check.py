"""``bench/device_check.py`` (the GPU checks, run by hand on a lent GPU) keeps working: its
rounded part and the ``replay-here`` step, with the CPU standing in for the GPU
(``DK_DEVICE_GPU=cpu``). CI has no GPU; this only keeps the script from rotting between
the sessions that have one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SRC

SCRIPT = SRC.parent / "bench" / "device_check.py"


def _run(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DK_DEVICE_GPU": "cpu", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(SRC.parent), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, str(SCRIPT), str(out), *args], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.mark.slow
def test_the_device_script_runs_with_the_cpu_standing_in(tmp_path: Path) -> None:
    proc = _run(tmp_path, "rounded", "--steps", "1")
    res = json.loads((tmp_path / "device_check.json").read_text())
    for kind in ("resnet", "lm"):
        for check in ("same_sites_on_both_devices", "cuda_log_replayed_on_cpu",
                      "cpu_log_replayed_on_cuda"):  # fmt: skip
            assert res[kind][check]["ok"], (kind, check, proc.stdout[-2000:])
        # the one expected failure with the CPU on both sides: plain float32 agrees with itself
        assert not res[kind]["plain_fp32_cpu_vs_cuda_differ"]["ok"]
    here = _run(tmp_path, "replay-here", "--steps", "1")
    assert here.returncode == 0, here.stdout[-2000:] + here.stderr[-2000:]
    assert here.stdout.count("PASS") == 8  # 2 examples x 2 logs x 1 and 2 threads
