"""Replayable compressed training (issue 5): codec state is part of every checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.helpers import WORKER, make_bundle, tiny_job
from vectors.gen.forge import Forgery

from dk.errors import FormatError
from dk.verifier import verify_bundle

BEACON = bytes(32)


@pytest.fixture(scope="module")
def topk_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    job = tiny_job(train={"compression": "topk:0.05"})
    return make_bundle(tmp_path_factory.mktemp("topk"), job)


def test_compressed_job_verifies(topk_bundle: tuple[object, Path]) -> None:
    job, bundle = topk_bundle
    report = verify_bundle(bundle, job, beacon=BEACON, samples=100)
    assert report.ok, report.codes
    f = Forgery(bundle, bundle.parent / "peek")
    last = f.tensors(len(f.m["checkpoints"]) - 1)
    assert int(last["compress/rng_counter"][0]) >= 0
    assert any(k.endswith("/residual") and np.abs(v).sum() > 0 for k, v in last.items())


def test_tampered_residual_fails_replay(topk_bundle: tuple[object, Path], tmp_path: Path) -> None:
    """Zeroing the error-feedback residual of checkpoint 2 (re-committed, re-signed) changes
    what interval 2 replays to."""
    job, bundle = topk_bundle
    f = Forgery(bundle, tmp_path / "res")
    t = f.tensors(2)
    for k in t:
        if k.endswith("/residual"):
            t[k] = np.zeros_like(t[k])
    f.put(2, t)
    report = verify_bundle(f.commit(WORKER), job, beacon=BEACON, samples=100)
    assert report.codes[0] == "REPLAY_MISMATCH"
    assert report.reasons[0].interval in (1, 2)


def test_codec_state_in_uncompressed_job_is_rejected(tmp_path: Path) -> None:
    job, bundle = make_bundle(tmp_path)
    f = Forgery(bundle, tmp_path / "extra")
    t = f.tensors(1)
    t["compress/rng_counter"] = np.zeros(1, dtype=np.uint64)
    f.put(1, t)
    assert verify_bundle(f.commit(WORKER), job, beacon=BEACON).codes == ["SHAPE_MISMATCH"]


def test_codec_spelling_is_canonical_and_powersgd_refused() -> None:
    a = tiny_job(train={"compression": "topk:0.05"})
    b = tiny_job(train={"compression": "topk:ratio=0.05"})
    assert a.job_id == b.job_id
    with pytest.raises(FormatError, match="powersgd"):
        tiny_job(train={"compression": "powersgd:rank=2"})
    with pytest.raises(FormatError, match="compression"):
        tiny_job(train={"compression": "zip:9"})


def test_a_diverging_compressed_step_is_training_diverged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC III §5: the worker stops on a non-finite gradient and its error says its training
    diverged; the same error is a verifier's REPLAY_MISMATCH (a FormatError with that reason,
    ``dk.pol.replay.STATE_REASONS``), not malformed input to the worker."""
    from dk.compress.state import CompressedSGDStep, NonFiniteGradient
    from dk.errors import TrainingDiverged
    from dk.pol import train_job
    from dk.pol.replay import STATE_REASONS

    calls = {"n": 0}
    real = CompressedSGDStep.step

    def step(self: CompressedSGDStep, grads: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise NonFiniteGradient("non-finite gradient for 'fc0.weight': training diverged")
        return real(self, grads)

    monkeypatch.setattr(CompressedSGDStep, "step", step)
    job = tiny_job(train={"compression": "topk:0.05"}, pol={"backend": "torch"})
    with pytest.raises(TrainingDiverged, match="non-finite gradient"):
        train_job(job, tmp_path / "run")
    e = NonFiniteGradient("x")
    assert isinstance(e, FormatError) and e.reason in STATE_REASONS
