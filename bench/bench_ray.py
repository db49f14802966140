"""`make bench` (Ray): verifying 8 bundles on a local Ray vs one after the other, in one run.

Eight honest bundles of one digits MLP job (64-256-10, 2,000 steps, k = 50) are verified with every
interval challenged, first sequentially in this process, then by ``dk verify-many --ray local``
(one Ray task per bundle on ``num_cpus = 2``). Printed side by side: the sequential time, the
Ray time, the speed-up, and Ray's fixed start-up cost (measured separately). On 2 cores the
ceiling is about 2x; the report digests must be equal.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

N_BUNDLES = 8


def main() -> None:
    import ray

    from dk.crypto.keys import SigningKey
    from dk.pol import default_job, train_job
    from dk.prover import prove_run
    from dk.verifier.executors import RayExecutor
    from dk.verifier.many import verify_many

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        root = tmp / "round"
        root.mkdir()
        job = default_job(hidden=[256], steps=2000, interval=50, batch_size=64)
        train_job(job, tmp / "run")
        for i in range(N_BUNDLES):
            prove_run(tmp / "run", job, SigningKey(bytes([i + 1]) * 32), root / f"b{i}")
        kw = {"beacon": bytes(32), "samples": 1000, "topq": 0}
        t0 = time.perf_counter()
        seq = verify_many(root, job, **kw)
        t_seq = time.perf_counter() - t0
        t0 = time.perf_counter()
        ex = RayExecutor("local", num_cpus=2)
        t_start = time.perf_counter() - t0
        verify_many(root, job, executor=ex, **kw)  # warm the workers
        t0 = time.perf_counter()
        par = verify_many(root, job, executor=ex, **kw)
        t_ray = time.perf_counter() - t0
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    same = [r["digest"] for _, r in seq] == [r["digest"] for _, r in par]
    ok = all(r["verdict"] == "accept" for _, r in par)
    print(f"{'bundles':<28}{N_BUNDLES:>10}")
    print(f"{'sequential, one process (s)':<28}{t_seq:>10.2f}")
    print(f"{'Ray, 2 CPUs (s)':<28}{t_ray:>10.2f}")
    print(f"{'speed-up':<28}{t_seq / t_ray:>10.2f}x")
    print(f"{'Ray start-up, fixed (s)':<28}{t_start:>10.2f}")
    print(f"same digests: {same}; all accepted: {ok}")


if __name__ == "__main__":
    main()
