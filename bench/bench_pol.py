"""Foundation benchmarks (issue 2), all measured in this one run.

1. Recording overhead: train with ``Recorder`` / train without, same steps, MLP of ≥ 1M
   parameters, k = 50 (target ≤ 1.05).
2. Verification cost: verify CPU time / training CPU time, with enough samples for ≥ 99 %
   detection of a worker who skipped 10 % of intervals, on a run of ≥ 1000 intervals
   (target ≤ 0.05).
3. Commitment throughput: ``tensors_root`` GB/s next to plain ``hashlib.sha256`` on the same
   bytes.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def _train_plain(job, threads: int = 1) -> float:
    """The same loop as ``train_job`` without the recorder; returns wall seconds."""
    from dk.pol.data import load_dataset
    from dk.pol.kernel_adapter import KernelSession, uses_kernels
    from dk.pol.models import build_model
    from dk.pol.sampler import job_sampler
    from dk.pol.torch_adapter import batch_tensors, deterministic, make_loss, make_optimizer

    ds = load_dataset(job)
    sampler = job_sampler(job, len(ds))
    if uses_kernels(job):
        session = KernelSession(job)
        t0 = time.perf_counter()
        for t in range(job.steps):
            idx = sampler.batch(t)
            session.step(ds.X[idx], ds.y[idx])
        return time.perf_counter() - t0
    with deterministic(threads):
        model = build_model(job)
        opt = make_optimizer(job, model.parameters())
        loss_fn = make_loss(job, ds.output_dim)
        t0 = time.perf_counter()
        for t in range(job.steps):
            x, y = batch_tensors(ds, sampler.batch(t))
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
        return time.perf_counter() - t0


def recording_overhead(tmp: Path) -> None:
    from dk.pol import default_job, train_job
    from dk.pol.models import num_parameters

    for backend in ("torch", "dk"):
        job = default_job(
            hidden=[1024, 1024], steps=200, interval=50, batch_size=128, pol={"backend": backend}
        )
        n = num_parameters(job.model)
        _train_plain(job)  # warm-up (and kernel compilation)
        plain, recorded = [], []
        for rep in range(3):
            plain.append(_train_plain(job))
            t0 = time.perf_counter()
            train_job(job, tmp / f"run{rep}")
            recorded.append(time.perf_counter() - t0)
            shutil.rmtree(tmp / f"run{rep}")
        p, r = min(plain), min(recorded)
        print(
            f"recording overhead  backend={backend:5s} MLP {n / 1e6:.2f}M params, {job.steps} "
            f"steps, k={job.interval}, batch 128"
        )
        print(f"  plain {p:.2f} s   recorded {r:.2f} s   ratio {r / p:.3f}   (target <= 1.05)")


def verification_cost(tmp: Path) -> None:
    from dk.crypto.keys import SigningKey
    from dk.pol import default_job, train_job
    from dk.prover import prove_run
    from dk.verifier import verify_bundle
    from dk.verifier.challenge import detection_probability, samples_for

    job = default_job(hidden=[64], steps=10000, interval=10, batch_size=32)
    m = job.num_intervals
    c0 = time.process_time()
    train_job(job, tmp / "vrun")
    train_cpu = time.process_time() - c0
    bundle = prove_run(tmp / "vrun", job, SigningKey.generate(), tmp / "vbundle")
    s = samples_for(m, 0.10, 0.99)
    print(
        f"verification cost  {m} intervals of {job.interval} steps, s={s} samples "
        f"(detection {detection_probability(m, s, 0.10):.4f} at 10% skipped), top-q 0; "
        f"train CPU {train_cpu:.2f} s"
    )
    for integrity in ("challenged", "all"):
        report = verify_bundle(bundle, job, samples=s, topq=0, integrity=integrity)
        assert report.ok, report.codes
        v = report.figures["verify_cpu_s"]
        print(
            f"  integrity={integrity:10s} verify CPU {v:.2f} s   ratio {v / train_cpu:.3f}   "
            f"(target <= 0.05)  {report.figures['checkpoints_checked']} checkpoints, "
            f"{report.figures['bytes_read'] / 1e6:.1f} MB read, "
            f"replay {report.figures['replay_wall_s']:.2f} s wall"
        )


def commitment_throughput() -> None:
    from dk.crypto.encoding import tensors_root

    rng = np.random.default_rng(0)
    tensors = {f"w{i}": rng.standard_normal(8_000_000, dtype=np.float32) for i in range(8)}
    nbytes = sum(t.nbytes for t in tensors.values())

    def best(fn) -> float:
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return nbytes / min(ts) / 1e9

    def plain() -> None:
        h = hashlib.sha256()
        for t in tensors.values():
            h.update(memoryview(t))
        h.digest()

    base = best(plain)
    one = best(lambda: tensors_root(tensors))
    two = best(lambda: tensors_root(tensors, threads=2))
    print(f"commitment throughput on {nbytes / 1e6:.0f} MB")
    print(
        f"  hashlib sha256 {base:.2f} GB/s   tensors_root {one:.2f} GB/s ({one / base:.2f}x)   "
        f"tensors_root threads=2 {two:.2f} GB/s ({two / base:.2f}x)"
    )


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="dk-bench-"))
    try:
        commitment_throughput()
        recording_overhead(tmp)
        verification_cost(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
