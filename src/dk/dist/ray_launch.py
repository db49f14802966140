"""Ray actors as the ranks of a data-parallel run (SPEC §8.5).

``dk train job.toml --out RUN --ray ADDRESS --world-size W --key-dir KEYS`` starts ``W`` actors
(one CPU each); actor 0 opens a gloo rendezvous on its node, every actor joins it and runs
:func:`dk.dist.rank.train_rank` with its own key ``KEYS/rank<r>.key`` (read on the actor's node:
one machine or a shared path). An actor that dies fails the run: the driver raises and the
run directory stays incomplete, so ``dk prove`` refuses it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from dk.errors import BackendUnavailable, DkError, ExitCode
from dk.pol.job import JobSpec, as_job
from dk.pol.ray_init import ensure_ray
from dk.pol.run import RunInfo, read_run


class RankDied(DkError):
    """A rank's actor died or failed; the run is incomplete (exit 69: the cluster fell short)."""

    exit_code = ExitCode.UNAVAILABLE


class _Rank:
    """Ray actor body: one rank (gloo over TCP, rendezvous at rank 0's node)."""

    def endpoint(self) -> str:
        """A free TCP port on this node, as a gloo init address (asked of rank 0 only)."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        return f"tcp://{host}:{port}"

    def run(
        self,
        spec: dict[str, Any],
        base_dir: str,
        run_dir: str,
        key_path: str,
        rank: int,
        world: int,
        address: str,
        timeout_s: float,
        fault: str,
    ) -> bool:
        """Train as ``rank``; True when done (rank 0 has written the run)."""
        from dk.crypto.keys import load_signing_key
        from dk.dist.comm import init_group, shutdown
        from dk.dist.rank import FAULT_ENV, train_rank

        if fault:  # test seam, as under torchrun
            os.environ[FAULT_ENV] = fault
        job = JobSpec(spec, Path(base_dir))
        device = str(job.train.get("device", "cpu"))  # gloo on CPU, NCCL on CUDA
        comm = init_group(
            device=device, rank=rank, world_size=world, address=address, timeout_s=timeout_s
        )
        try:
            train_rank(job, run_dir, comm=comm, key=load_signing_key(key_path))
        finally:
            shutdown()
        return True


def train_on_ray(
    job: JobSpec | str | Path,
    run_dir: str | Path,
    *,
    key_dir: str | Path,
    address: str = "local",
    world_size: int | None = None,
    timeout_s: float = 600.0,
    num_cpus: int | None = None,
) -> RunInfo:
    """Train ``job`` on ``W`` Ray actors; returns rank 0's run summary.

    Args:
        job: the job (its ``train.world_size`` is ``W``).
        run_dir: the run directory (rank 0 writes it; on one machine or a shared path).
        key_dir: directory of the ranks' keys ``rank<r>.key``.
        address: a Ray address, or ``"local"`` to start Ray on this machine.
        world_size: if given, must equal the job's ``train.world_size``.
        timeout_s: how long the driver waits for the ranks (and they for each other).
        num_cpus: CPUs of a local Ray (default: Ray's choice).

    Raises:
        BackendUnavailable: Ray is not installed.
        FormatError: (``address="local"``) a rank's key is missing or not a secret key; Ray is
            not started.
        RankDied: an actor died or a rank failed; the run is incomplete.
    """
    try:
        import ray
    except ImportError:
        raise BackendUnavailable("training on Ray needs Ray: pip install 'dk-pol[ray]'") from None
    from dk.dist.launch import rank_key_path
    from dk.dist.rank import FAULT_ENV

    job = as_job(job)
    w = job.world_size
    if world_size is not None and world_size != w:
        raise DkError(f"--world-size {world_size}, the job's train.world_size is {w}")
    if w < 2:
        raise DkError("the job has train.world_size = 1: train it without --ray")
    if address == "local":  # every rank on this machine: its keys are here, read them first
        from dk.crypto.keys import load_signing_key

        for r in range(w):
            load_signing_key(rank_key_path(key_dir, r))
    ensure_ray(ray, address, num_cpus)
    env = {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": os.environ.get("NUMBA_NUM_THREADS", "1")}
    gpus = 1 if str(job.train.get("device", "cpu")).startswith("cuda") else 0  # NCCL ranks
    actor: Any = ray.remote(
        num_cpus=1, num_gpus=gpus, max_restarts=0, runtime_env={"env_vars": env}
    )(_Rank)
    ranks: list[Any] = [actor.remote() for _ in range(w)]
    try:
        init = ray.get(ranks[0].endpoint.remote(), timeout=timeout_s)
        fault = os.environ.get(FAULT_ENV, "")
        futs = [
            a.run.remote(
                job.spec,
                str(Path(job.base_dir).resolve()),
                str(Path(run_dir).resolve()),
                str(rank_key_path(Path(key_dir).resolve(), r)),
                r,
                w,
                init,
                timeout_s,
                fault,
            )
            for r, a in enumerate(ranks)
        ]
        pending = list(futs)
        while pending:  # the first failure ends the run (a dead actor, a rank's error)
            done, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
            if not done:
                raise RankDied(f"the ranks did not finish within {timeout_s:g} s")
            try:
                ray.get(done[0])
            except Exception as e:
                r = futs.index(done[0])
                msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
                raise RankDied(f"rank {r} failed: {msg}") from None
    finally:
        for a in ranks:
            ray.kill(a)
    return read_run(run_dir)
