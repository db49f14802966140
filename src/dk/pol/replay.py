"""The replay engine: re-run one interval from its committed start checkpoint (SPEC §12).

Everything that shapes the computation comes from the job (model, optimizer, hyperparameters,
loss, data, sampler), never from the bundle; the bundle only supplies the start state.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dk.crypto.numeric import fold_sum_inplace
from dk.errors import FormatError
from dk.pol.checkpoint import Tensors, model_tensors
from dk.pol.data import Dataset
from dk.pol.job import JobSpec
from dk.pol.sampler import job_sampler


class Replayer:
    """Replays intervals of one job; model, optimizer and loss are built once and reused.

    Everything that shapes the computation comes from the job; a start checkpoint only
    supplies weights and optimizer state, which :meth:`run` loads afresh each time.
    """

    def __init__(
        self,
        job: JobSpec,
        dataset: Dataset,
        *,
        threads: int | None = 1,
        device: str | None = None,
    ) -> None:
        from dk.pol.kernel_adapter import KernelSession, uses_kernels

        self.rounded = job.pol.get("backend") == "rounded"  # SPEC VI: follow the interval's log
        self.job, self.dataset, self.threads = job, dataset, threads
        #: The step losses ``ℓ_t`` of the last :meth:`run` (SPEC §11.7), in step order.
        self.step_losses: list[float] = []
        self.sampler = job_sampler(job, len(dataset), sparse=True)  # a few batches an epoch
        self.kernels = KernelSession(job) if uses_kernels(job) else None
        #: Data-parallel jobs (SPEC §8.5): each rank's step digests of the last replay.
        self.rank_steps: list[list[bytes]] | None = None
        if self.kernels is not None and job.world_size > 1:
            from dk.pol.parallel import ParallelKernelSession

            self.kernels = ParallelKernelSession(job)
        if self.kernels is not None:  # dk kernels: torch is never imported (a fixed cost)
            return
        #: Tolerant data-parallel jobs: the ranks simulated on torch (SPEC §8.5).
        self.parallel: Any = None
        if job.world_size > 1:
            from dk.pol.parallel_torch import ParallelTorchSession

            out_dim = getattr(dataset, "output_dim", None)
            self.parallel = ParallelTorchSession(job, output_dim=out_dim, device=device)
            return
        from dk.pol.models import build_fresh
        from dk.pol.replay_optim import ReplayOptimizer
        from dk.pol.torch_adapter import make_loss, replay_device

        self.device = replay_device(job, device)
        self.model = build_fresh(job).to(self.device)
        from dk.pol.torch_adapter import hidden_state

        self._hidden = hidden_state(self.model)  # a fresh model's, restored before each run
        # torch's own update without torch.optim.Optimizer, which imports torch._dynamo
        self.optimizer: Any = ReplayOptimizer(job, self.model.parameters())
        self.loss_fn = make_loss(job, getattr(dataset, "output_dim", None))

    def run(
        self,
        start: Mapping[str, np.ndarray],
        start_step: int,
        end_step: int,
        *,
        rounding_log: bytes | None = None,
    ) -> Tensors:
        """Replay steps ``start_step .. end_step - 1`` from ``start``; the end checkpoint.

        ``rounding_log``: the interval's log blob, required by (and only for) a
        ``pol.backend = "rounded"`` job (SPEC VI); its binding to the job and interval is the
        caller's check. A log that does not fit this replay raises ``RoundingLogError``.
        """
        self.step_losses = []
        self.sampler.prefetch(start_step, end_step)
        if self.job.world_size > 1 and self.kernels is not None:  # W ranks in rank order
            from dk.pol.parallel import ParallelKernelSession, replay_parallel

            assert isinstance(self.kernels, ParallelKernelSession)
            end, self.rank_steps = replay_parallel(
                self.kernels, self.dataset, self.sampler, start, start_step, end_step
            )
            return end
        if self.kernels is not None:  # exact mode on dk's kernels (SPEC Part II)
            self.kernels.restore(start)
            for t in range(start_step, end_step):
                idx = self.sampler.batch(t)
                loss = self.kernels.step(self.dataset.X[idx], self.dataset.y[idx])
                self.step_losses.append(loss)
            return self.kernels.snapshot(end_step, self.sampler.steps_per_epoch)
        if self.parallel is not None:  # tolerant, W ranks on torch in rank order
            from dk.pol.parallel import replay_parallel
            from dk.pol.torch_adapter import deterministic

            with deterministic(self.threads):
                end, _ = replay_parallel(
                    self.parallel, self.dataset, self.sampler, start, start_step, end_step
                )
            return end
        from dk.pol.torch_adapter import (
            compress_hook,
            deterministic,
            make_codec,
            reset_hidden_state,
            restore,
            snapshot,
        )

        codec = make_codec(self.job)  # fresh state machine; its state comes from ``start``
        hook = compress_hook(codec)
        mode = _rounding_mode(self.rounded, rounding_log)
        with deterministic(self.threads):
            reset_hidden_state(self.model, self._hidden)  # SPEC §10.1: as freshly built
            restore(start, self.model, self.optimizer, self.job, codec)
            self.model.train()
            dp = self.job.train.get("dp")
            with mode if mode is not None else contextlib.nullcontext():
                self._steps(start_step, end_step, dp, hook)
            if mode is not None:
                mode.finish()  # SPEC VI §2 step 4: site count and trace
            return snapshot(
                self.model, self.optimizer, self.job, end_step, self.sampler.steps_per_epoch, codec
            )

    def _steps(self, start_step: int, end_step: int, dp: Any, hook: Any) -> None:
        from dk.pol.torch_adapter import job_batch, train_step

        for t in range(start_step, end_step):
            x, y = job_batch(self.job, self.dataset, self.sampler, t)
            if dp is not None:  # DP-SGD with the step's committed noise (SPEC VII §4)
                hook = _dp_hook(self.loss_fn, x, y, dp, self.job.seed, t)
            loss = train_step(
                self.model,
                self.optimizer,
                self.loss_fn,
                x,
                y,
                hook,
                job=self.job,
                step=t,
                device=self.device,
            )
            self.step_losses.append(loss)


def _rounding_mode(rounded: bool, blob: bytes | None) -> Any:
    """The replay mode following ``blob`` (SPEC VI), or None for other backends."""
    if not rounded and blob is None:
        return None
    from dk.errors import FormatError

    if not rounded or blob is None:
        raise FormatError("a rounding log is given exactly for pol.backend = 'rounded' replays")
    from dk.pol.backends.log import decode_log
    from dk.pol.backends.rounded import RoundedMode

    return RoundedMode.replay(decode_log(blob))


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
    # SPEC §1.4: fixed-order sums, so the verdict l2 <= tolerance is the same on every machine.
    nc, nr = (math.sqrt(fold_sum_inplace(u * u)) for u in (upd_c, upd_r))

    def ratio(num: float, den: float) -> float:  # a claimed update of zero: infinitely far
        return num / den if den >= tiny else (0.0 if num == 0.0 else float("inf"))

    return {
        "l2": ratio(math.sqrt(fold_sum_inplace(diff * diff)), nc),
        "linf": ratio(
            float(np.max(np.abs(diff), initial=0.0)), float(np.max(np.abs(upd_c), initial=0.0))
        ),
        "cosine": fold_sum_inplace(upd_c * upd_r) / max(nc * nr, tiny),
    }


#: FormatError reasons of a replay that stopped on the committed start state (SPEC §12.3): the
#: worker's (``REPLAY_MISMATCH``), never the verifier's internal error.
STATE_REASONS = frozenset(("REPLAY_MISMATCH", "BAD_CODEC_STATE"))


def replay_matches(
    replayer: Replayer,
    start: Mapping[str, np.ndarray],
    claimed: Mapping[str, np.ndarray] | None,
    claimed_root: bytes,
    start_step: int,
    end_step: int,
    rounding_log: bytes | None = None,
) -> tuple[bool, dict[str, Any]]:
    """Replay an interval and judge it by the job's mode; returns (ok, figures).

    A rounded job's replay that fails on its log (SPEC VI §5) is not ok, with the code in
    ``figures["reason"]`` (``BACKEND_UNAVAILABLE`` for an uncovered operation: the verifier's
    own shortfall).
    """
    from dk.crypto.hashing import digests_equal
    from dk.pol.checkpoint import checkpoint_root
    from dk.pol.loss import interval_loss, loss_required

    exact = replayer.job.mode in ("exact", "zk")
    try:
        end = replayer.run(start, start_step, end_step, rounding_log=rounding_log)
    except FormatError as e:  # SPEC VI §5: the log does not fit, or an op is not covered
        from dk.pol.backends import rounding_reason

        code = rounding_reason(e)
        if code is None and e.reason in STATE_REASONS:  # SPEC §12.3: a start state no honest
            code = "REPLAY_MISMATCH"  # run holds (codec state, a non-finite gradient)
        if code is None:
            raise
        return False, {"reason": code, "message": str(e)}
    fig: dict[str, Any] = {}
    if loss_required(replayer.job):  # SPEC §11.7: the caller compares it with the claimed loss
        fig["loss"] = interval_loss(replayer.step_losses)
    if exact:
        root = checkpoint_root(end)
        fig["replayed_root"] = root.hex()
        if replayer.rank_steps is not None:  # data-parallel: the blame's evidence (SPEC §12.6)
            fig["rank_steps"] = [[d.hex() for d in r] for r in replayer.rank_steps]
        return digests_equal(root, claimed_root), fig
    assert claimed is not None
    d: dict[str, Any] = {**distances(start, claimed, end), **fig}
    return d["l2"] <= float(replayer.job.pol["tolerance"]), d


def make_replayer(job: JobSpec, dataset: Dataset, device: str | None = None) -> Replayer:
    """A replayer with the thread policy of the job's mode (1 thread for exact/zk; any number
    for the rounded backend, whose results do not depend on it, SPEC VI), on ``device``
    (default: the job's device where this machine has it, else the CPU)."""
    pin = job.mode in ("exact", "zk") and job.pol.get("backend") != "rounded"
    return Replayer(job, dataset, threads=1 if pin else None, device=device)
