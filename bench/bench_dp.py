"""`make bench` (data-parallel): the recording overhead of a W = 2 run, in one run.

Two gloo ranks (spawned processes on 127.0.0.1) train one digits MLP job (64-256-10, batch 64
split 32 + 32, 1,000 steps, k = 50) twice:

* **without dk**: each rank computes its shard's gradient on dk's kernels, the ranks
  all-gather the raw float32 gradients, sum them in rank order, divide by 2 and step; nothing
  is recorded;
* **with dk**: :func:`dk.dist.train_rank`: the same step plus the canonical gradient messages,
  per-rank step digests, rank 0's recording (snapshots, hashing, blobs), rank 1's own
  checkpoint roots and update norms, and the exchange and check of the manifest and the
  rank signatures at the end.

Printed: both wall times on rank 0, the overhead ratio, and whether both runs ended on the
same weights (they must: the arithmetic is the same).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

STEPS, K, BATCH, HIDDEN = 1000, 50, 64, 256


def _job() -> Any:
    from dk.pol import default_job

    job = default_job(hidden=[HIDDEN], steps=STEPS, interval=K, batch_size=BATCH)
    return job.with_updates(train={"world_size": 2})


def _plain(job: Any, comm: Any) -> tuple[float, bytes]:
    """The same data-parallel training with no recording; (seconds, final weights' bytes)."""
    import numpy as np

    from dk.pol.data import load_dataset
    from dk.pol.kernel_adapter import KernelSession
    from dk.pol.sampler import job_sampler

    ds = load_dataset(job)
    sampler = job_sampler(job, len(ds))
    s = KernelSession(job)
    names = list(s.trainer.param_shapes().items())
    r, w = comm.rank, comm.world_size
    t0 = time.perf_counter()
    for t in range(job.steps):
        idx = sampler.batch(t)[r::w]
        _, g = s.trainer.gradient(s.params, ds.X[idx], ds.y[idx])
        flat = np.concatenate([g[n].ravel() for n, _ in names]).tobytes()
        parts = [np.frombuffer(b, np.float32) for b in comm.all_gather_bytes(flat)]
        total = parts[0].copy()
        for p in parts[1:]:
            total += p
        total /= np.float32(w)
        grads, off = {}, 0
        for n, shape in names:
            size = int(np.prod(shape))
            grads[n] = total[off : off + size].reshape(shape)
            off += size
        s.trainer.apply_gradients(s.params, s.state, grads)
    dt = time.perf_counter() - t0
    return dt, b"".join(s.params[n].tobytes() for n, _ in names)


def _rank(rank: int, port: int, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    from dk.crypto.keys import SigningKey
    from dk.dist.comm import init_gloo, shutdown
    from dk.dist.rank import train_rank
    from dk.pol.pack import read_run_checkpoint

    comm = init_gloo(rank=rank, world_size=2, address=f"tcp://127.0.0.1:{port}")
    try:
        job = _job()
        warm = job.with_updates(train={"steps": 5}, pol={"interval": 5, "init_root": ""})
        _plain(warm, comm)  # compile the kernels once, outside both timings
        t_plain, plain_w = _plain(job, comm)
        run = Path(out) / "run"
        t0 = time.perf_counter()
        info = train_rank(
            job, run if rank == 0 else None, comm=comm, key=SigningKey(bytes([rank + 1]) * 32)
        )
        t_dk = time.perf_counter() - t0
        if rank == 0:
            assert info is not None
            last = read_run_checkpoint(run, info.checkpoints[-1].root)
            dk_w = b"".join(last[k].tobytes() for k in plain_order(job))
            doc = {"plain_s": t_plain, "dk_s": t_dk, "same": dk_w == plain_w}
            (Path(out) / "result.json").write_text(json.dumps(doc))
    finally:
        shutdown()


def plain_order(job: Any) -> list[str]:
    """``model/<name>`` in the trainer's parameter order (how ``_plain`` concatenates)."""
    from dk.pol.exact import ExactTrainer
    from dk.pol.kernel_adapter import optimizer_spec

    tr = ExactTrainer(job.model, optimizer_spec(job), job.train["loss"])
    return [f"model/{n}" for n in tr.param_shapes()]


def main() -> None:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_rank, args=(port, d), nprocs=2, join=True)
        res = json.loads((Path(d) / "result.json").read_text())
    print(f"{'job':<34}mlp 64-{HIDDEN}-10, {STEPS} steps, k = {K}, W = 2")
    print(f"{'W = 2 without dk (s)':<34}{res['plain_s']:>10.2f}")
    print(f"{'W = 2 with dk, recorded (s)':<34}{res['dk_s']:>10.2f}")
    print(f"{'recording overhead':<34}{res['dk_s'] / res['plain_s']:>10.2f}x")
    print(f"same final weights: {res['same']}")


if __name__ == "__main__":
    main()
