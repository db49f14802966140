"""Helpers for the rounded-backend tests: run the worker script at a given thread count."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("worker.py")
SRC = Path(__file__).resolve().parents[3] / "src"


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch on one intra-op thread for the test (this machine is shared), then as it was."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def run_worker(threads: int, out: Path, *args: str, env: dict[str, str] | None = None) -> None:
    """Run ``worker.py`` in a fresh process pinned to ``threads`` threads (OMP and torch);
    ``env`` adds variables (another machine: ``ATEN_CPU_CAPABILITY``, ``MKL_*``)."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           **(env or {})}  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(WORKER), str(threads), str(out), *args],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.fail(f"worker ({threads} threads) failed:\n{proc.stderr[-4000:]}")


def read(out: Path, name: str) -> str:
    """One output file of the worker."""
    return (out / name).read_text()
