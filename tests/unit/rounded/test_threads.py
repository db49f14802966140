"""Fifty honest seeds trained on 2 threads and replayed on 1 under their logs: no rejection.

Each run is a separate process with OMP_NUM_THREADS / torch.set_num_threads pinned. (The ResNet
and tiny-LM examples across thread counts run through the Recorder, prove and verify in
``test_bundle_threads.py``.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import read, run_worker


@pytest.mark.slow
def test_fifty_honest_seeds_no_false_rejection(tmp_path: Path) -> None:
    spec = "mlp:256:64:3:50"
    two, one = tmp_path / "two", tmp_path / "one"
    run_worker(2, two, spec, "--no-plain")
    run_worker(1, one, spec, "--replay", str(two), "--no-train")
    rejected = [
        s for s in range(50) if read(one, f"mlp-{s}.replayed") != read(two, f"mlp-{s}.rounded")
    ]
    assert rejected == []
