"""Work the verifier does per challenged interval (issue 11 §4: verification at its floor)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import make_bundle, tiny_job

import dk.crypto.encoding as encoding
from dk.verifier import verify_bundle


def test_blobs_of_one_schema_are_hashed_from_one_stream_plan(tmp_path: Path) -> None:
    """Every checkpoint of a run has one schema; the verifier parses blobs in one order, so
    hashing them reuses one cached stream plan instead of planning each blob afresh."""
    job, bundle = make_bundle(tmp_path, tiny_job(steps=40, interval=2))
    encoding._PLANS.clear()
    r = verify_bundle(bundle, job, beacon=bytes(32), samples=20, topq=0, integrity="all")
    assert r.ok and r.figures["checkpoints_checked"] == 21
    # a few plans (checkpoint 0 has no momentum buffers; the initial weights and the replay's
    # snapshots come in their own orders), however many blobs: not one per blob
    assert len(encoding._PLANS) <= 6
