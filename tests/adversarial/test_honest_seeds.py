"""Honest bundles are accepted: exact mode, 20 seeds, not a single false rejection."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import make_bundle, tiny_job

from dk.verifier import verify_bundle


@pytest.mark.slow
def test_twenty_seeds_no_false_rejection(tmp_path: Path) -> None:
    rejected = []
    for seed in range(20):
        job, bundle = make_bundle(tmp_path / str(seed), tiny_job(seed=seed, steps=15))
        report = verify_bundle(bundle, job, beacon=seed.to_bytes(32, "little"), samples=1000)
        if not report.ok:
            rejected.append((seed, report.codes))
    assert rejected == []
