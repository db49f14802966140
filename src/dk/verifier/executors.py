"""Where challenged intervals are replayed: in-process, local processes, or Ray (SPEC §12.5).

An executor only decides *where* each challenged interval's replay runs; what is replayed and
how it is judged is the same everywhere (:func:`dk.pol.replay.replay_matches` on the tensors the
integrity check already verified), so a report is the same bytes whichever executor ran it.

:class:`RayExecutor` runs each interval as a Ray task (one CPU, or one GPU when the job trains
on CUDA). Checkpoint tensors reach the tasks by content: each verified checkpoint is put into
Ray's object store once, keyed by its committed root, and every task that needs it gets the
reference; the job and the verifier's own dataset are put once per verification. A task whose
worker process dies is retried (``retries``); if it still fails the verification is
*inconclusive* (``EXECUTOR_FAILED``): the verifier's machine fell short, which never counts
against the worker and never accepts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dk.errors import BackendUnavailable, DkError
from dk.pol.ray_init import ensure_ray

if TYPE_CHECKING:
    from dk.pol.job import JobSpec

Tensors = dict[str, Any]
Results = dict[int, tuple[bool, dict[str, Any]]]


class ExecutorFailed(DkError):
    """The executor could not run a replay (a worker died past its retries, a lost node)."""


#: An executor's result figure for an interval whose replay raised (the task ran and failed,
#: its machine did not): the report records that interval's ``INTERNAL_ERROR`` and judges the
#: others (SPEC §12.3), where a lost machine makes the whole report ``EXECUTOR_FAILED``.
ERROR_KEY = "error"


def task_error(ray: Any, e: BaseException) -> BaseException | None:
    """The exception a Ray task raised itself (``RayTaskError``'s cause), or None when Ray
    failed around it (a dead worker, a lost node, a timeout)."""
    if not isinstance(e, ray.exceptions.RayTaskError):
        return None
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


def _replay_remote(
    spec: dict[str, Any],
    base_dir: str,
    dataset: Any,
    start: Tensors,
    claimed: Tensors | None,
    claimed_root: bytes,
    start_step: int,
    end_step: int,
    kill_once: str | None,
    log: bytes | None = None,
) -> tuple[bool, dict[str, Any], float, int]:
    """Ray task body: replay one interval (Ray resolves the object references for us)."""
    if kill_once and not os.path.exists(kill_once):  # test seam: die once, mid-replay
        Path(kill_once).write_text("killed")
        os._exit(1)
    from dk.pol.job import JobSpec
    from dk.pol.replay import make_replayer, replay_matches

    t0 = time.process_time()
    replayer = make_replayer(JobSpec(spec, Path(base_dir)), dataset)
    ok, fig = replay_matches(replayer, start, claimed, claimed_root, start_step, end_step, log)
    return ok, fig, time.process_time() - t0, os.getpid()


class RayExecutor:
    """Replay challenged intervals as Ray tasks.

    Args:
        address: a Ray cluster address (``ray://host:port`` or ``auto``), or ``"local"`` to start
            a local Ray on this machine (``num_cpus`` CPUs).
        num_cpus: CPUs of a local Ray (ignored for a cluster).
        retries: how often a task whose worker died is run again before the verification is
            inconclusive.
        kill_once: test seam only: a marker path; the first task to run creates it and kills
            its own worker process, as a crashed machine would.

    Raises:
        BackendUnavailable: Ray is not installed (``pip install 'dk-pol[ray]'``).
    """

    name = "ray"

    def __init__(
        self,
        address: str = "local",
        *,
        num_cpus: int = 2,
        retries: int = 2,
        kill_once: str | None = None,
    ) -> None:
        try:
            import ray
        except ImportError:
            raise BackendUnavailable(
                "verification on Ray needs Ray: pip install 'dk-pol[ray]'"
            ) from None
        self._ray = ray
        self.address, self.retries, self._kill_once = address, retries, kill_once
        ensure_ray(ray, address, num_cpus)
        self._task = ray.remote(_replay_remote)

    def replay(
        self,
        job: JobSpec,
        dataset: Any,
        tasks: list[tuple[int, Tensors, Tensors | None, bytes, int, int, bytes | None]],
        held_roots: dict[int, str],
    ) -> tuple[Results, float, int]:
        """Run the replays; returns ``({interval: (ok, figures)}, worker CPU s, processes)``.

        Args:
            job: the job.
            dataset: the verifier's own copy of the data.
            tasks: ``(interval, start, claimed, claimed_root, start_step, end_step, log)``
                (``log``: the rounding log of a ``pol.backend = "rounded"`` job, else None).
            held_roots: ``{checkpoint index: root hex}`` of the tensors in ``tasks``, so each
                checkpoint goes into the object store once, by content.

        Raises:
            ExecutorFailed: a task failed past its retries.
        """
        ray = self._ray
        spec_ref = ray.put(job.spec)
        ds_ref = ray.put(dataset)
        by_root: dict[str, Any] = {}

        def ref(index: int, tensors: Tensors | None) -> Any:
            if tensors is None:
                return None
            root = held_roots[index]
            if root not in by_root:
                by_root[root] = ray.put(tensors)
            return by_root[root]

        gpu = 1 if str(job.train.get("device", "cpu")).startswith("cuda") else 0
        opts = {"num_cpus": 1, "num_gpus": gpu, "max_retries": self.retries}
        futures = {
            i: self._task.options(**opts).remote(
                spec_ref,
                str(job.base_dir),
                ds_ref,
                ref(i, start),
                ref(i + 1, claimed),
                claimed_root,
                s,
                e,
                self._kill_once,
                log,
            )
            for i, start, claimed, claimed_root, s, e, log in tasks
        }
        results: Results = {}
        cpu, pids = 0.0, set()
        for i, fut in futures.items():
            try:
                ok, fig, t, pid = ray.get(fut)
            except Exception as e:  # Ray raises WorkerCrashedError, RayTaskError, ...
                cause = task_error(ray, e)
                if isinstance(cause, BackendUnavailable):  # as the local paths: exit 4
                    raise cause from None
                if cause is not None:  # the replay itself raised: that interval's own trouble
                    results[i] = (False, {ERROR_KEY: f"{type(cause).__name__}: {cause}"})
                    continue
                raise ExecutorFailed(
                    f"replay of interval {i} failed on Ray after {self.retries} retries: "
                    f"{type(e).__name__}"
                ) from None
            results[i] = (ok, fig)
            cpu += t
            pids.add(pid)
        return results, cpu, len(pids)


def ray_executor(address: str, **kwargs: Any) -> RayExecutor:
    """The executor ``dk verify --ray ADDRESS`` uses (``local`` starts Ray on this machine)."""
    return RayExecutor(address, **kwargs)
