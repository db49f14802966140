"""Exact mode on dk's reproducible kernels (SPEC Part II): a NumPy training session.

A :class:`KernelSession` holds the parameters and optimizer state of a job as NumPy arrays
and advances them with :class:`dk.pol.exact.ExactTrainer`, whose every reduction has a fixed
order. Checkpoints use the same names as the PyTorch path (SPEC §10.1), so the transcript,
prover and verifier are unchanged; only the arithmetic differs, and it gives the same bits on
any thread count, CPU or GPU.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from dk.pol.checkpoint import Tensors, hparam_tensors, meta_tensors
from dk.pol.models import initial_state

if TYPE_CHECKING:
    from dk.pol.job import JobSpec

# Below this many multiply-adds per step, parallel regions cost more than they save: on a
# busy 2-core machine a 64-64-10 step took 0.07 ms on one thread and 39 ms on two (OpenMP
# hand-off per tiny kernel). Bits never depend on the thread count, only speed does.
PARALLEL_MIN_MACS = 100_000_000


def kernel_threads(job: JobSpec) -> int | None:
    """Threads for the kernels: ``DK_KERNEL_THREADS`` if set, else 1 for small steps and
    Numba's own count (``NUMBA_NUM_THREADS``) for large ones (``None``)."""
    env = os.environ.get("DK_KERNEL_THREADS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"DK_KERNEL_THREADS must be an integer, not {env!r}") from None
    from dk.pol.models import num_parameters

    macs = 3 * int(job.train["batch_size"]) * num_parameters(job.model)
    return 1 if macs < PARALLEL_MIN_MACS else None


@contextlib.contextmanager
def _numba_threads(n: int | None) -> Iterator[None]:
    if n is None:
        yield
        return
    import numba

    old = numba.get_num_threads()
    # numba.config's attributes are set at import from the environment; its stubs omit them.
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    try:
        yield
    finally:
        numba.set_num_threads(old)


def _numba_num_threads() -> int:
    import numba

    return int(numba.get_num_threads())


def uses_kernels(job: JobSpec) -> bool:
    """True when the job trains and replays on dk's reproducible kernels."""
    return bool(job.mode == "exact" and job.pol.get("backend", "dk") == "dk")


def optimizer_spec(job: JobSpec) -> dict[str, Any]:
    """The job's optimizer in :class:`ExactTrainer` form."""
    t = job.train
    if t["optimizer"] == "sgd":
        return {
            "name": "sgd",
            "lr": t["lr"],
            "momentum": t["momentum"],
            "weight_decay": t["weight_decay"],
        }
    return {
        "name": "adam",
        "lr": t["lr"],
        "betas": list(t["betas"]),
        "eps": t["eps"],
        "weight_decay": t["weight_decay"],
    }


class KernelSession:
    """Parameters and optimizer state of one job, advanced by the exact kernels."""

    def __init__(self, job: JobSpec, *, device: str = "cpu") -> None:
        from dk.pol.exact import ExactTrainer
        from dk.pol.exact.aot import kernel_mode

        kernel_mode()  # DK_KERNELS is valid, whichever kernels this session runs
        self.job = job
        self.threads = kernel_threads(job)
        self.trainer = ExactTrainer(
            job.model, optimizer_spec(job), job.train["loss"], device=device,
            serial=self.threads == 1,
        )  # fmt: skip
        self.params: dict[str, np.ndarray] = {
            k: np.ascontiguousarray(v) for k, v in initial_state(job).items()
        }
        self.state: dict[str, np.ndarray] = {}
        #: Numba's thread count while the last step ran (0 before the first step).
        self.threads_used = 0

    def restore(self, ck: Mapping[str, np.ndarray]) -> None:
        """Load ``model/*`` and ``optim/<param>/*`` tensors of a checkpoint (copies)."""
        self.params = {
            name: np.array(ck[f"model/{name}"], dtype=np.float32, order="C")
            for name in self.trainer.param_shapes()
        }
        self.state = {}
        for key, value in ck.items():
            if key.startswith("optim/") and key.count("/") >= 2:
                self.state[key[len("optim/") :]] = np.array(value, dtype=np.float32, order="C")

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One training step on a batch; returns the batch loss before the update."""
        if getattr(self.trainer.be, "compiled", "") == "aot":  # one thread, Numba not loaded
            self.threads_used = 1
            return self.trainer.step(
                self.params, self.state, np.ascontiguousarray(x, dtype=np.float32), y
            )
        with _numba_threads(self.threads):
            self.threads_used = _numba_num_threads()
            return self.trainer.step(
                self.params, self.state, np.ascontiguousarray(x, dtype=np.float32), y
            )

    def parallel_workers(self, iterations: int = 4096) -> int:
        """Distinct Numba worker threads that ran a parallel loop under this session's thread
        setting (CPU): more than one shows that the kernels' parallel path runs."""
        from dk.pol.exact._cpu import thread_ids

        ids = np.full(iterations, -1, dtype=np.int64)
        with _numba_threads(self.threads):
            thread_ids(ids)
        return len(set(ids.tolist()))

    def snapshot(self, step: int, steps_per_epoch: int) -> Tensors:
        """The checkpoint at ``step`` (SPEC §10.1)."""
        ck: Tensors = {f"model/{k}": v.copy() for k, v in self.params.items()}
        ck.update({f"optim/{k}": np.array(v, dtype=np.float32) for k, v in self.state.items()})
        ck.update(hparam_tensors(self.job))
        ck.update(meta_tensors(self.job, step, steps_per_epoch))
        return ck
