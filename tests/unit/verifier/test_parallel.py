"""Parallel replay (``workers > 1``) uses the caller's dataset and the tensors the integrity
check verified, never a file the job names or a blob re-read from the bundle (issue 11)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.helpers import WORKER, make_bundle, tiny_job

from dk.pol.data import load_dataset
from dk.verifier import verify_bundle

BEACON = bytes(range(32))

pytestmark = pytest.mark.slow  # a spawned pool costs a few seconds


@pytest.fixture(scope="module")
def npz_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Any]:
    """An npz-data bundle whose data file is gone once loaded: only ``dataset=`` can feed it."""
    tmp = tmp_path_factory.mktemp("npz")
    digits = load_dataset(tiny_job())
    np.savez(tmp / "data.npz", X=digits.X[:400], y=digits.y[:400])
    job = tiny_job(dataset="npz", data_path="data.npz", base_dir=tmp)
    job, bundle = make_bundle(tmp, job, WORKER)
    ds = load_dataset(job)
    (tmp / "data.npz").unlink()
    return job, bundle, ds


def test_workers_use_the_callers_dataset(npz_bundle: tuple[Any, Path, Any]) -> None:
    job, bundle, ds = npz_bundle
    one = verify_bundle(bundle, job, beacon=BEACON, samples=100, dataset=ds, workers=1)
    two = verify_bundle(bundle, job, beacon=BEACON, samples=100, dataset=ds, workers=2)
    assert one.ok and two.ok, (one.codes, two.codes, [f.message for f in two.reasons])
    assert two.figures["replay_processes"] == 2  # the parallel path ran, in two processes
    assert one.digest() == two.digest()
    # without the caller's dataset the verifier has no data: inconclusive, never a rejection
    none = verify_bundle(bundle, job, beacon=BEACON, samples=100, workers=2)
    assert none.verdict == "inconclusive" and none.codes == ["DATA_UNAVAILABLE"]


def test_workers_never_reread_a_blob(npz_bundle: tuple[Any, Path, Any], tmp_path: Path) -> None:
    """A blob swapped after the integrity check cannot reach a worker: workers get tensors."""
    import shutil

    import dk.verifier.replay as replay_mod

    job, bundle, ds = npz_bundle
    b = tmp_path / "b"
    shutil.copytree(bundle, b)
    original = replay_mod._replay_parallel

    def swap_then_replay(*args: Any, **kw: Any) -> Any:
        for blob in (b / "blobs").iterdir():  # damage every blob once integrity has passed
            blob.write_bytes(b"garbage")
        return original(*args, **kw)

    replay_mod._replay_parallel = swap_then_replay  # type: ignore[assignment]
    try:
        r = verify_bundle(b, job, beacon=BEACON, samples=100, dataset=ds, workers=2)
    finally:
        replay_mod._replay_parallel = original  # type: ignore[assignment]
    assert r.ok, r.codes
