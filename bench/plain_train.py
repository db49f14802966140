"""Baseline process for the whole-process benchmarks: train a job with no recording.

``python -m bench.plain_train JOB.toml`` runs the same steps as ``dk train JOB.toml`` (same data,
batch order, backend and thread policy) and writes nothing: no checkpoints, hashes or log. It
imports only what that loop needs, as a user's own training script would: on dk's kernels that
is NumPy and Numba, never torch.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from dk.pol.data import load_dataset
    from dk.pol.job import load_job
    from dk.pol.kernel_adapter import KernelSession, uses_kernels
    from dk.pol.sampler import job_sampler

    job = load_job(argv[0])
    ds = load_dataset(job)
    sampler = job_sampler(job, len(ds))
    if uses_kernels(job):
        session = KernelSession(job)
        for t in range(job.steps):
            idx = sampler.batch(t)
            session.step(ds.X[idx], ds.y[idx])
        return 0
    from dk.pol.models import build_model
    from dk.pol.torch_adapter import batch_tensors, deterministic, make_loss, make_optimizer

    with deterministic(1 if job.mode in ("exact", "zk") else None):
        model = build_model(job)
        opt = make_optimizer(job, model.parameters())
        loss_fn = make_loss(job, ds.output_dim)
        for t in range(job.steps):
            x, y = batch_tensors(ds, sampler.batch(t))
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
