"""Work the verifier does per challenged interval (issue 11 §4: verification at its floor)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.helpers import make_bundle, tiny_job

import dk.crypto.encoding as encoding
import dk.pol.sampler as sampler
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


def test_a_challenged_verify_takes_its_batches_from_the_permutation_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``challenged`` derives the challenged intervals' batches on demand (``epoch_index``), in
    the batch check and in each replay, without an epoch's whole shuffle; ``all`` checks every
    batch, which the whole shuffles serve (SPEC §8: the same indices either way)."""
    job, bundle = make_bundle(tmp_path, tiny_job(steps=40, interval=2))
    calls = {"index": 0, "whole": 0}
    index, whole = sampler.epoch_index, sampler.epoch_permutation

    def counted(name: str, fn: Any) -> Any:
        def f(*a: Any) -> Any:
            calls[name] += 1
            return fn(*a)

        return f

    monkeypatch.setattr(sampler, "epoch_index", counted("index", index))
    monkeypatch.setattr(sampler, "epoch_permutation", counted("whole", whole))
    r = verify_bundle(bundle, job, beacon=bytes(32), samples=5, topq=0)
    assert r.ok and calls["whole"] == 0
    assert calls["index"] == 2 * len(r.challenged)  # one walk per interval: check, replay
    calls.update(index=0, whole=0)
    r = verify_bundle(bundle, job, beacon=bytes(32), samples=5, topq=0, integrity="all")
    assert r.ok and calls["whole"] >= 20
