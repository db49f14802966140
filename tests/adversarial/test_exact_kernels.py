"""Exact mode on dk's reproducible kernels (issue 3): bitwise across thread counts, δ = 0.

Training and verification run in separate processes with different ``NUMBA_NUM_THREADS`` and
``DK_KERNEL_THREADS``; the verifier still requires the replayed checkpoint root to equal the
committed one. These tests run the CPU kernels; the CUDA kernels are tested only under Numba's
CUDA simulator (``tests/unit/exact``), which cannot show GPU bit-exactness (SPEC II).
"""

from __future__ import annotations

import json
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

# Train in a child process whose kernels run on N threads; print what they ran with.
_TRAIN = """
import json, sys
from dk.pol import load_job, train_job
from dk.pol.kernel_adapter import KernelSession
job = load_job("job.toml")
session = KernelSession(job)
train_job(job, "run", engine=session)
print(json.dumps({"threads": session.threads_used, "workers": session.parallel_workers()}))
"""

# Verify in a child process; spy on the replayers the verifier builds to report their threads.
_VERIFY = """
import json
from pathlib import Path
import dk.pol.replay as replay
from dk.pol import load_job
from dk.verifier import verify_bundle
made = []
def spy(job, dataset, *rest):
    made.append(_make(job, dataset, *rest))
    return made[-1]
_make, replay.make_replayer = replay.make_replayer, spy
job = load_job("job.toml")
report = verify_bundle(Path("b"), job, beacon=bytes(32), samples=100, topq=0)
k = made[0].kernels
print(json.dumps({"ok": report.ok, "codes": report.codes, "replayed": report.figures.get(
    "replayed_intervals"), "threads": k.threads_used, "workers": k.parallel_workers()}))
"""


def _child(code: str, threads: int, cwd: Path) -> dict[str, object]:
    env = {
        **os.environ,
        "NUMBA_NUM_THREADS": str(threads),  # the pool Numba starts
        "DK_KERNEL_THREADS": str(threads),  # the kernels' own knob (else 1 for a small step)
        "OMP_NUM_THREADS": "1",
    }
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("train_threads", "verify_threads"), [(1, 2), (2, 1)])
def test_trained_on_n_threads_verified_on_m(
    tmp_path: Path, train_threads: int, verify_threads: int
) -> None:
    """Training on N kernel threads and replaying on M gives the same roots (δ = 0).

    Each side reports the thread count its steps ran with and how many distinct Numba worker
    threads ran a parallel loop under the same setting, so the 2-thread side provably took
    the parallel path (``test_plain_torch_differs_across_threads`` shows that thread counts
    change ordinary float32 training, so this comparison is not vacuous).
    """
    job = tiny_job(hidden=[32], steps=24, interval=4, batch_size=64)
    assert job.pol["backend"] == "dk"
    (tmp_path / "job.toml").write_text(job.to_toml())
    WORKER.save(tmp_path / "w.key")
    trained = _child(_TRAIN, train_threads, tmp_path)
    assert trained == {"threads": train_threads, "workers": train_threads}
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    prove = [*DK, "prove", "run", "--job", "job.toml", "--key", "w.key", "--out", "b"]
    r = subprocess.run(prove, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    verified = _child(_VERIFY, verify_threads, tmp_path)
    assert verified["ok"] is True, verified["codes"]
    assert verified["replayed"] == job.num_intervals  # every interval replayed
    assert (verified["threads"], verified["workers"]) == (verify_threads, verify_threads)


def test_plain_torch_differs_across_threads() -> None:
    """The control: plain float32 torch training on 1 and on 2 intra-op threads gives other
    bits, so equal roots across thread counts are something the exact kernels earn. Which
    shapes torch splits across threads depends on the CPU (torch 2.13 CPU: an MLP at batch 256
    differed on an AMD EPYC with AVX2 and not on an Intel Xeon with AVX-512, where batch 1024
    and the CNN differ), so two jobs run and at least one must differ."""
    import torch

    from dk.pol.checkpoint import checkpoint_root, initial_checkpoint
    from dk.pol.data import load_dataset
    from dk.pol.replay import Replayer

    differ = []
    for kw in ({"hidden": [256], "batch_size": 1024}, {"arch": "cnn", "batch_size": 256}):
        job = tiny_job(steps=8, interval=8, pol={"backend": "torch"}, **kw)
        ds = load_dataset(job)
        roots, seen = {}, {}
        for threads in (1, 2):
            rep = Replayer(job, ds, threads=threads)
            rep.model.register_forward_pre_hook(
                lambda *_, n=threads, seen=seen: seen.__setitem__(n, torch.get_num_threads())
            )
            start = initial_checkpoint(job, rep.sampler.steps_per_epoch)
            roots[threads] = checkpoint_root(rep.run(start, 0, job.steps))
        assert seen == {1: 1, 2: 2}  # torch really ran on 2 threads
        differ.append(roots[1] != roots[2])
    assert any(differ)


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
