"""Other optimizers, architectures and the tolerant mode, each trained and verified (tiny)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from tests.helpers import WORKER, make_bundle, tiny_job
from vectors.gen.forge import Forgery

from dk.pol.calibrate import calibrate
from dk.pol.replay import distances
from dk.verifier import verify_bundle

BEACON = bytes(32)


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param(dict(optimizer="adam"), id="adam"),
        pytest.param(dict(arch="cnn", hidden=None, steps=8, interval=4), id="cnn"),
        pytest.param(dict(loss="mse", hidden=[6], train={"momentum": 0.0}), id="mse-no-momentum"),
        pytest.param(
            dict(hidden=[5, 4], model={"activation": "gelu"}, steps=7, interval=3),
            id="gelu-partial",
        ),
    ],
)
def test_job_variants_train_and_verify(kw: dict, tmp_path: Path) -> None:
    job, bundle = make_bundle(tmp_path, tiny_job(**kw))
    report = verify_bundle(bundle, job, beacon=BEACON, samples=100)
    assert report.ok, report.to_dict()
    assert report.challenged == list(range(job.num_intervals))


@pytest.fixture(scope="module")
def tolerant(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    return make_bundle(tmp_path_factory.mktemp("tol"), tiny_job(mode="tolerant", tolerance=1e-3))


def test_tolerant_accepts_honest(tolerant: tuple[object, Path]) -> None:
    job, bundle = tolerant
    report = verify_bundle(bundle, job, beacon=BEACON, samples=100)
    assert report.ok, report.to_dict()
    assert report.mode == "tolerant"
    assert 0.0 <= report.figures["max_l2_distance"] <= 1e-3
    assert report.figures["tolerance"] == 1e-3


def test_tolerant_rejects_a_perturbed_checkpoint(
    tolerant: tuple[object, Path], tmp_path: Path
) -> None:
    job, bundle = tolerant
    f = Forgery(bundle, tmp_path / "perturbed")
    j = 2
    start, end = f.tensors(j - 1), f.tensors(j)
    rng = np.random.default_rng(0)
    for k in end:
        if k.startswith("model/"):
            update = end[k] - start[k]
            scale = 0.5 * float(np.abs(update).max())  # half the interval's largest update
            end[k] = (end[k] + scale * rng.standard_normal(end[k].shape)).astype(np.float32)
    f.put(j, end)  # re-committed, norms recomputed: only replay can tell
    forged = f.commit(WORKER)
    report = verify_bundle(forged, job, beacon=BEACON, samples=100)
    assert not report.ok
    assert set(report.codes) == {"REPLAY_MISMATCH"}
    assert {r.interval for r in report.reasons} <= {j - 1, j} and report.reasons[
        0
    ].interval == j - 1
    assert report.checks["blobs"] == "pass" and report.checks["metadata"] == "pass"
    assert report.figures["max_l2_distance"] > 1e-3


def test_distances() -> None:
    a = {"model/w": np.zeros(4, np.float32), "meta/step": np.array(0)}
    c = {"model/w": np.array([1, 0, 0, 0], np.float32)}
    d = distances(a, c, c)
    assert d == {"l2": 0.0, "linf": 0.0, "cosine": 1.0}
    r = {"model/w": np.array([0, 1, 0, 0], np.float32)}
    d = distances(a, c, r)
    assert math.isclose(d["l2"], math.sqrt(2)) and d["linf"] == 1.0 and d["cosine"] == 0.0
    same = distances(a, a, a)  # a zero update never divides by zero
    assert all(math.isfinite(v) for v in same.values())


def test_calibrate() -> None:
    job = tiny_job(mode="tolerant", tolerance=1e-3)
    cal = calibrate(job, intervals=2, replay_threads=(1, 2))
    # a tolerant job: the thread counts here, and each CPU variant (a subprocess) on 1 thread:
    # every x86-64 capability below this CPU's (AVX-512: default and AVX2)
    ladder = ["default", "avx2", "avx512"]
    cap = cal.cpu_capability
    below = ladder[: ladder.index(cap)] if cap in ladder else ["default"] * (cap != "default")
    assert cal.cpu_variants == below
    assert cal.intervals == 2 and len(cal.rows) == 4 + 2 * len(cal.cpu_variants)
    here = {(r["interval"], r["threads"]) for r in cal.rows if r["cpu"] == cal.cpu_capability}
    assert here == {(0, 1), (0, 2), (1, 1), (1, 2)}
    assert {(r["interval"], r["cpu"]) for r in cal.rows if r["cpu"] != cal.cpu_capability} == {
        (i, c) for i in (0, 1) for c in cal.cpu_variants
    }
    for r in cal.rows:
        assert all(math.isfinite(r[k]) for k in ("l2", "linf", "cosine"))
        assert r["l2"] >= 0 and r["cosine"] > 0.999
    assert cal.max_l2 == max(r["l2"] for r in cal.rows)
    assert cal.recommended_tolerance >= 1e-6
    assert cal.recommended_tolerance == max(1e-6, 10.0 * cal.max_l2)
    assert (
        calibrate(
            job, intervals=1, replay_threads=(1,), floor=0.25, force=True, cpu_variants=False
        ).recommended_tolerance
        >= 0.25
    )
    assert set(cal.to_dict()) >= {"rows", "max_l2", "recommended_tolerance"}
