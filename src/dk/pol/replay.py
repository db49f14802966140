"""The replay engine: re-run one interval from its committed start checkpoint (SPEC §12).

Everything that shapes the computation comes from the job (model, optimizer, hyperparameters,
loss, data, sampler), never from the bundle; the bundle only supplies the start state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dk.pol.checkpoint import Tensors, model_tensors
from dk.pol.data import Dataset
from dk.pol.job import JobSpec
from dk.pol.sampler import job_sampler


class Replayer:
    """Replays intervals of one job; model, optimizer and loss are built once and reused.

    Everything that shapes the computation comes from the job; a start checkpoint only
    supplies weights and optimizer state, which :meth:`run` loads afresh each time.
    """

    def __init__(self, job: JobSpec, dataset: Dataset, *, threads: int | None = 1) -> None:
        from dk.pol.kernel_adapter import KernelSession, uses_kernels
        from dk.pol.models import build_torch_model
        from dk.pol.torch_adapter import make_loss, make_optimizer

        self.job, self.dataset, self.threads = job, dataset, threads
        self.sampler = job_sampler(job, len(dataset))
        self.kernels = KernelSession(job) if uses_kernels(job) else None
        self.model = build_torch_model(job.model)
        self.optimizer = make_optimizer(job, self.model.parameters())
        self.loss_fn = make_loss(job, dataset.output_dim)

    def run(self, start: Mapping[str, np.ndarray], start_step: int, end_step: int) -> Tensors:
        """Replay steps ``start_step .. end_step - 1`` from ``start``; the end checkpoint."""
        from dk.pol.torch_adapter import (
            batch_tensors,
            compress_hook,
            deterministic,
            make_codec,
            restore,
            snapshot,
            train_step,
        )

        if self.kernels is not None:  # exact mode on dk's kernels (SPEC Part II)
            self.kernels.restore(start)
            for t in range(start_step, end_step):
                idx = self.sampler.batch(t)
                self.kernels.step(self.dataset.X[idx], self.dataset.y[idx])
            return self.kernels.snapshot(end_step, self.sampler.steps_per_epoch)
        codec = make_codec(self.job)  # fresh state machine; its state comes from ``start``
        hook = compress_hook(codec)
        with deterministic(self.threads):
            restore(start, self.model, self.optimizer, self.job, codec)
            dp = self.job.train.get("dp")
            for t in range(start_step, end_step):
                x, y = batch_tensors(self.dataset, self.sampler.batch(t))
                if dp is not None:  # DP-SGD with the step's committed noise (SPEC VII §4)
                    hook = _dp_hook(self.loss_fn, x, y, dp, self.job.seed, t)
                train_step(self.model, self.optimizer, self.loss_fn, x, y, hook)
            return snapshot(
                self.model, self.optimizer, self.job, end_step, self.sampler.steps_per_epoch, codec
            )


def _dp_hook(loss_fn: Any, x: Any, y: Any, dp: dict[str, Any], seed: int, t: int) -> Any:
    from dk.pol.dp import dp_grads_

    return lambda model: dp_grads_(model, loss_fn, x, y, dp=dp, seed=seed, step=t)


def replay_interval(
    job: JobSpec,
    dataset: Dataset,
    start: Mapping[str, np.ndarray],
    start_step: int,
    end_step: int,
    *,
    threads: int | None = 1,
) -> Tensors:
    """Replay steps ``start_step .. end_step - 1`` from ``start``; returns the end checkpoint.

    Args:
        job: the job (source of every hyperparameter).
        dataset: the verifier's copy of the job's data.
        start: the committed start checkpoint.
        start_step: its step.
        end_step: the step after the last replayed one.
        threads: torch intra-op threads (1 with deterministic algorithms for exact mode;
            ``None`` leaves torch's defaults, as in tolerant training).
    """
    return Replayer(job, dataset, threads=threads).run(start, start_step, end_step)


def distances(
    start: Mapping[str, np.ndarray],
    claimed: Mapping[str, np.ndarray],
    replayed: Mapping[str, np.ndarray],
) -> dict[str, float]:
    """Tolerant-mode distances between the claimed and replayed end weights (SPEC §12.3).

    Returns ``l2`` (‖claimed − replayed‖₂ / ‖claimed − start‖₂), ``linf`` (max |claimed −
    replayed| / max |claimed − start|) and ``cosine`` (cosine similarity of the claimed and
    replayed updates).
    """
    a, c, r = (
        np.concatenate([v.astype(np.float64).ravel() for _, v in sorted(model_tensors(t).items())])
        for t in (start, claimed, replayed)
    )
    upd_c, upd_r, diff = c - a, r - a, c - r
    tiny = np.finfo(np.float64).tiny
    nc, nr = float(np.linalg.norm(upd_c)), float(np.linalg.norm(upd_r))
    return {
        "l2": float(np.linalg.norm(diff)) / max(nc, tiny),
        "linf": float(np.max(np.abs(diff), initial=0.0))
        / max(float(np.max(np.abs(upd_c), initial=0.0)), tiny),
        "cosine": float(np.dot(upd_c, upd_r)) / max(nc * nr, tiny),
    }


def replay_matches(
    replayer: Replayer,
    start: Mapping[str, np.ndarray],
    claimed: Mapping[str, np.ndarray] | None,
    claimed_root: bytes,
    start_step: int,
    end_step: int,
) -> tuple[bool, dict[str, Any]]:
    """Replay an interval and judge it by the job's mode; returns (ok, figures)."""
    from dk.crypto.hashing import digests_equal
    from dk.pol.checkpoint import checkpoint_root

    exact = replayer.job.mode in ("exact", "zk")
    end = replayer.run(start, start_step, end_step)
    if exact:
        root = checkpoint_root(end)
        return digests_equal(root, claimed_root), {"replayed_root": root.hex()}
    assert claimed is not None
    d = distances(start, claimed, end)
    return d["l2"] <= float(replayer.job.pol["tolerance"]), d


def make_replayer(job: JobSpec, dataset: Dataset) -> Replayer:
    """A replayer with the thread policy of the job's mode (1 thread for exact/zk)."""
    return Replayer(job, dataset, threads=1 if job.mode in ("exact", "zk") else None)
