"""Train on one "machine", replay on another: the job's default τ makes the roots agree.

The two machines are two processes that differ in everything a CPU and its libraries choose
about float32 (and float64) results: torch's kernel path (``ATEN_CPU_CAPABILITY=default``, the
scalar/SSE kernels, against this machine's AVX2 ones), MKL's code path
(``MKL_ENABLE_INSTRUCTIONS=SSE4_2`` against its best) and the thread count (2 against 1).
torch here links MKL, not OpenBLAS, so ``OPENBLAS_CORETYPE`` would change nothing. Plain float32
training from the same initial weights on the same batches ends at other roots on the two
(so the test can fail); the rounded backend, replaying the first machine's log on the second,
ends at the same root (SPEC VI §2, default ``k`` of ``pol.rounding_tau_log2``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dk.pol.backends.log import DEFAULT_TAU_LOG2, decode_log

from .conftest import read, run_worker

OTHER = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
SPECS = ("resnet:8:16:3", "lm:64:8:3")


@pytest.mark.slow
def test_rounded_roots_agree_across_machines_where_plain_fp32_does_not(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    run_worker(2, a, *SPECS, env=OTHER)
    run_worker(1, b, *SPECS, "--init", str(a), "--replay", str(a))
    for kind in ("resnet", "lm"):
        name = f"{kind}-0"
        assert decode_log((a / f"{name}.log").read_bytes()).tau_log2 == DEFAULT_TAU_LOG2
        assert read(b, f"{name}.plain") != read(a, f"{name}.plain"), kind  # machines differ
        assert read(b, f"{name}.replayed") == read(a, f"{name}.rounded"), kind
