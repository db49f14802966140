"""examples/resnet_images at CI size: record in the user's loop, prove, verify, forgeries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vectors.gen.forge import FORGERIES, Forgery

from dk.crypto.keys import SigningKey

pytestmark = pytest.mark.slow

BEACON = bytes(32)
KEY = SigningKey(bytes(range(32)))  # the example's worker key
# A forgery that rewrites every model/* tensor in float32 also turns BatchNorm's int64
# counters into floats: the schema check then catches it before the replay does.
ALSO = {n: {"SHAPE_MISMATCH"} for n in ("random-final", "interpolated", "interpolated-lr")}


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    from tests.examples.loader import load_example

    ex = load_example("resnet_images")
    work = tmp_path_factory.mktemp("resnet")
    ex.consumer(work, images=96, steps=8, interval=2)
    ex.worker(work)
    return ex, work


def test_the_users_loop_records_buffers_and_the_verifier_accepts(example: tuple[Any, Path]) -> None:
    from dk.pol import load_job
    from dk.pol.pack import read_run_checkpoint
    from dk.pol.run import read_run

    ex, work = example
    job = load_job(work / "job.toml")
    assert job.model["arch"] == "custom" and job.train["augment"] == ["crop:4", "flip"]
    assert job.data["kind"] == "images" and job.mode == "tolerant"
    info = read_run(work / "run")
    last = read_run_checkpoint(work / "run", info.checkpoints[-1].root)
    assert int(last["model/block0.norm1.num_batches_tracked"]) == 8
    report = ex.verifier(work, beacon=BEACON, samples=1000)
    assert report.ok, report.to_dict()
    assert report.challenged == list(range(4))


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forgeries_are_rejected(name: str, example: tuple[Any, Path], tmp_path: Path) -> None:
    from dk.pol import load_job
    from dk.verifier import verify_bundle

    _, work = example
    forge, reason = FORGERIES[name]
    forged = forge(Forgery(work / "bundle", tmp_path / name), KEY)
    report = verify_bundle(forged, load_job(work / "job.toml"), beacon=BEACON, samples=1000)
    assert report.verdict == "reject"
    assert report.codes[0] in {reason} | ALSO.get(name, set()), report.codes
