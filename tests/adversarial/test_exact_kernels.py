"""Exact mode on dk's reproducible kernels (issue 3): bitwise across thread counts, δ = 0.

Training and verification run in separate processes with different ``NUMBA_NUM_THREADS``;
the verifier still requires the replayed checkpoint root to equal the committed one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.helpers import WORKER, make_bundle, tiny_job
from vectors.gen.forge import Forgery

from dk.verifier import verify_bundle

DK = [sys.executable, "-m", "dk.cli"]


def _dk(args: list[str], threads: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NUMBA_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    return subprocess.run(
        [*DK, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
@pytest.mark.parametrize(("train_threads", "verify_threads"), [(1, 2), (2, 1)])
def test_trained_on_n_threads_verified_on_m(
    tmp_path: Path, train_threads: int, verify_threads: int
) -> None:
    job = tiny_job(hidden=[32], steps=24, interval=4, batch_size=64)
    assert job.pol["backend"] == "dk"
    (tmp_path / "job.toml").write_text(job.to_toml())
    WORKER.save(tmp_path / "w.key")
    r = _dk(["train", "job.toml", "--out", "run"], train_threads, tmp_path)
    assert r.returncode == 0, r.stderr
    r = _dk(
        ["prove", "run", "--job", "job.toml", "--key", "w.key", "--out", "b"],
        train_threads,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    r = _dk(
        ["verify", "b", "--job", "job.toml", "--samples", "100", "--json"], verify_threads, tmp_path
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert '"verdict": "accept"' in r.stdout


@pytest.fixture(scope="module")
def kernel_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    return make_bundle(tmp_path_factory.mktemp("kern"), tiny_job(optimizer="adam", lr=0.01))


def test_one_ulp_in_one_weight_is_rejected(
    kernel_bundle: tuple[object, Path], tmp_path: Path
) -> None:
    job, bundle = kernel_bundle
    assert verify_bundle(bundle, job, beacon=bytes(32), samples=100).ok
    f = Forgery(bundle, tmp_path / "ulp")
    t = f.tensors(3)
    w = t["model/fc0.weight"]
    w.flat[7] = np.nextafter(w.flat[7], np.float32(np.inf), dtype=np.float32)
    f.put(3, t)
    report = verify_bundle(f.commit(WORKER), job, beacon=bytes(32), samples=100)
    assert report.codes[0] == "REPLAY_MISMATCH"
    assert {r.interval for r in report.reasons} == {2, 3}  # ends at, and starts from, checkpoint 3


def test_torch_backend_remains_available(tmp_path: Path) -> None:
    job, bundle = make_bundle(tmp_path, tiny_job(pol={"backend": "torch"}))
    assert job.pol["backend"] == "torch"
    assert verify_bundle(bundle, job, beacon=bytes(32), samples=100).ok
    kernels = tiny_job()
    assert kernels.job_id != job.job_id  # the backend is part of the job


def test_kernel_and_torch_checkpoints_agree_closely(tmp_path: Path) -> None:
    """Same job on both backends: different bits (own operation order) but close weights."""
    _, a = make_bundle(tmp_path / "k", tiny_job())
    _, b = make_bundle(tmp_path / "t", tiny_job(pol={"backend": "torch"}))
    fa, fb = Forgery(a, tmp_path / "fa"), Forgery(b, tmp_path / "fb")
    ta, tb = fa.tensors(4), fb.tensors(4)
    assert any(not np.array_equal(ta[k], tb[k]) for k in ta if k.startswith("model/"))
    for k in ta:
        if k.startswith("model/"):
            np.testing.assert_allclose(ta[k], tb[k], rtol=1e-4, atol=1e-5)
