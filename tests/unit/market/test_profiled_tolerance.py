"""The verifier judges a tolerant job at the order's profiled tolerance (SPEC V §12): the job
binding is checked against the job as given, the replay against the tolerance passed in."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.helpers import WORKER, make_bundle, tiny_job
from vectors.gen.forge import Forgery

from dk.verifier import replay_interval, verify_bundle

BEACON = bytes(range(32))


@pytest.fixture(scope="module")
def perturbed(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    tmp = tmp_path_factory.mktemp("profiled")
    job, bundle = make_bundle(tmp, tiny_job(mode="tolerant", tolerance=1e-3))
    f = Forgery(bundle, tmp / "perturbed")
    start, end = f.tensors(1), f.tensors(2)
    rng = np.random.default_rng(0)
    for k in end:
        if k.startswith("model/"):
            scale = 0.5 * float(np.abs(end[k] - start[k]).max())
            end[k] = (end[k] + scale * rng.standard_normal(end[k].shape)).astype(np.float32)
    f.put(2, end)
    return job, f.commit(WORKER)


def test_the_tolerance_passed_in_decides_the_replay(perturbed: tuple[object, Path]) -> None:
    job, bundle = perturbed
    tight = verify_bundle(bundle, job, beacon=BEACON, samples=100)
    assert tight.verdict == "reject" and tight.figures["tolerance"] == 1e-3
    distance = tight.figures["max_l2_distance"]
    loose = verify_bundle(bundle, job, beacon=BEACON, samples=100, tolerance=10 * distance)
    assert loose.verdict == "accept", loose.to_dict()
    assert loose.figures["tolerance"] == 10 * distance
    assert loose.job_id == tight.job_id  # bound to the job as published
    assert replay_interval(bundle, job, 1).verdict == "reject"
    assert replay_interval(bundle, job, 1, tolerance=10 * distance).verdict == "accept"


def test_the_job_binding_is_checked_before_the_tolerance(perturbed: tuple[object, Path]) -> None:
    job, bundle = perturbed
    other = job.with_updates(pol={"tolerance": 1.0})  # another job_id
    report = verify_bundle(bundle, other, beacon=BEACON, samples=100, tolerance=1.0)
    assert report.verdict == "reject" and "JOB_MISMATCH" in report.codes
