"""Tolerant-mode data parallelism on PyTorch (SPEC §8.5 "Tolerant mode", §12.6).

A ``W``-rank tolerant job (``pol.mode = "tolerant"``, ``pol.backend = "torch"``) trains the
job's own model through torch. Each step follows SPEC §8.5 as on dk's kernels: rank ``r``
computes the mean-loss gradient of its shard ``idx[r::W]``, the ranks all-gather their
messages (the canonical tensor stream of the float32 gradients), every rank combines them in
rank order (:func:`dk.pol.parallel.combine`) and applies the job's clipping and optimizer to
the result. Model buffers (BatchNorm statistics) after a step are rank 0's.

:class:`ParallelTorchSession` is the step engine of one rank (with ``exchange``) or of all
of them in rank order (the verifier's replay). :func:`blame_tolerant` is the verifier's
per-rank check of a failing interval: it follows the committed messages and compares each
rank's message with its own recomputation of that rank's shard gradient (SPEC §12.6).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from dk.crypto.encoding import decode_tensors, encode_tensors
from dk.crypto.numeric import fold_sum_inplace
from dk.errors import FormatError
from dk.pol.parallel import (
    Exchange,
    Fault,
    Grads,
    RankDigests,
    combine,
    grad_message,
    parse_message,
    step_digest,
)

if TYPE_CHECKING:
    from dk.pol.job import JobSpec


class ParallelTorchSession(RankDigests):
    """A torch step engine for one rank of a tolerant data-parallel job, or for all of them.

    Same interface as :class:`dk.pol.parallel.ParallelKernelSession` (``step``,
    ``snapshot``, ``restore``, ``rank_digests``, ``step_digests``); it also keeps each
    interval's messages (:meth:`messages`), the evidence a tolerant bundle carries (§11.6).
    """

    def __init__(
        self,
        job: JobSpec,
        *,
        output_dim: int | None = None,
        rank: int = 0,
        exchange: Exchange | None = None,
        fault: Fault | None = None,
        device: str | None = None,
        keep_messages: bool = False,
    ) -> None:
        from dk.pol.models import build_fresh, build_model
        from dk.pol.torch_adapter import make_loss, make_optimizer, replay_device, resolve_device

        self.job, self.world_size = job, job.world_size
        self.rank, self.exchange, self.fault = rank, exchange, fault
        # a rank trains on the job's device; a verifier replays where it can (SPEC §12.3)
        self.device = (
            resolve_device(job, device) if exchange is not None else replay_device(job, device)
        )
        # a rank starts from checkpoint 0 (SPEC §10.2); a replay restores its start anyway
        self.model = (build_model(job) if exchange is not None else build_fresh(job)).to(
            self.device
        )
        self.optimizer = make_optimizer(job, self.model.parameters())
        self.loss_fn = make_loss(job, output_dim)
        self.params_list = list(self.model.named_parameters())
        self.shapes = {n: tuple(p.shape) for n, p in self.params_list}
        self._size = len(grad_message({n: np.zeros(s, np.float32) for n, s in self.shapes.items()}))
        self.t = 0
        self._digests: dict[int, list[list[bytes]]] = {}
        self._messages: dict[int, list[list[bytes]]] | None = {} if keep_messages else None
        self._previous: Grads | None = None
        self.threads_used = 1

    # -- state -------------------------------------------------------------------------
    def restore(self, ck: Mapping[str, np.ndarray], step: int | None = None) -> None:
        """Load a checkpoint; ``step`` (default: its ``meta/step``) is the next step."""
        from dk.pol.torch_adapter import restore

        restore(ck, self.model, self.optimizer, self.job)
        self.t = int(ck["meta/step"]) if step is None else step
        self._digests.clear()
        if self._messages is not None:
            self._messages.clear()

    def snapshot(self, step: int, steps_per_epoch: int) -> dict[str, np.ndarray]:
        """The common state at ``step`` (SPEC §10.1)."""
        from dk.pol.torch_adapter import snapshot

        return snapshot(self.model, self.optimizer, self.job, step, steps_per_epoch)

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The parameters as NumPy arrays (copies)."""
        return {n: p.detach().cpu().numpy().copy() for n, p in self.params_list}

    def _buffers(self) -> dict[str, np.ndarray]:
        return {n: b.detach().cpu().numpy().copy() for n, b in self.model.named_buffers()}

    def _load_buffers(self, bufs: Mapping[str, np.ndarray]) -> None:
        import torch

        with torch.no_grad():
            for n, b in self.model.named_buffers():
                b.copy_(torch.from_numpy(np.array(bufs[n])))

    # -- one rank's gradient -----------------------------------------------------------
    def shard_gradient(self, x: np.ndarray, y: np.ndarray, rank: int) -> Grads:
        """Rank ``rank``'s float32 mean-loss gradient on its shard of the global batch
        ``(x, y)`` (augmented already) at the current state (SPEC §8.5 step 2, §12.4)."""
        import torch

        from dk.pol.augment import seed_step
        from dk.pol.torch_adapter import autocast

        w, acc = self.world_size, int(self.job.train.get("accumulation", 1))
        xs = torch.from_numpy(np.ascontiguousarray(x[rank::w])).chunk(acc)
        ys = torch.from_numpy(np.ascontiguousarray(y[rank::w])).chunk(acc)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        for j in range(acc):
            seed_step(self.job.seed, self.t, rank * acc + j)  # SPEC §8.5: micro-batch r·A + j
            with autocast(self.job, self.device):
                out = self.model(xs[j].to(self.device))
            if torch.is_tensor(out) and out.is_floating_point():
                out = out.float()
            loss = self.loss_fn(out, ys[j].to(self.device)) / acc
            loss.backward()
        return {
            n: (
                np.zeros(s, np.float32)
                if p.grad is None
                else p.grad.detach().cpu().numpy().astype(np.float32, copy=True)
            )
            for (n, p), s in zip(self.params_list, self.shapes.values(), strict=True)
        }

    def rank_gradients(self, x: np.ndarray, y: np.ndarray) -> list[Grads]:
        """Every rank's gradient in rank order from the current state (the simulation).

        Each rank starts from the step's buffers; afterwards the model holds rank 0's."""
        start = self._buffers()
        grads, after0 = [], start
        for r in range(self.world_size):
            if r:
                self._load_buffers(start)
            grads.append(self.shard_gradient(x, y, r))
            if r == 0:
                after0 = self._buffers()
        if start:
            self._load_buffers(after0)
        return grads

    def _augmented(self, x: np.ndarray) -> np.ndarray:
        if not self.job.train.get("augment"):
            return x
        from dk.pol.augment import augment_batch

        return augment_batch(self.job, self.t, np.asarray(x))

    # -- one step ----------------------------------------------------------------------
    def apply(self, grads: list[Grads]) -> None:
        """Combine ``grads`` in rank order and apply clipping and the optimizer (§8.5)."""
        import torch

        from dk.pol.torch_adapter import clip_gradients, set_lr

        g = combine(grads)
        set_lr(self.job, self.optimizer, self.t)
        for n, p in self.params_list:
            p.grad = torch.from_numpy(g[n]).to(self.device)
        clip_gradients(self.job, self.model.parameters())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _record(self, msgs: list[bytes]) -> None:
        w, i = self.world_size, self.t // self.job.interval
        per_rank = self._digests.setdefault(i, [[] for _ in range(w)])
        for r, m in enumerate(msgs):
            per_rank[r].append(step_digest(self.t, m))
        if self._messages is not None:
            kept = self._messages.setdefault(i, [[] for _ in range(w)])
            for r, m in enumerate(msgs):
                kept[r].append(m)

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One data-parallel step on the step's raw **global** batch ``(x, y)``."""
        w = self.world_size
        x = self._augmented(x)
        if self.exchange is None:  # the verifier: every rank, in rank order
            msgs = [grad_message(g) for g in self.rank_gradients(x, y)]
        else:
            mine = self.shard_gradient(x, y, self.rank)
            if self.fault is not None:
                mine, self._previous = self.fault(self.t, self.rank, mine, self._previous), mine
            own = grad_message(mine)
            msgs = self.exchange(own)
            if len(msgs) != w or msgs[self.rank] != own:
                raise FormatError("the all-gather did not return this rank's message in place")
            if any(True for _ in self.model.buffers()):  # SPEC §8.5: rank 0's buffers
                got = self.exchange(encode_tensors(self._buffers()))[0]
                self._load_buffers(_parse_buffers(got, self._buffers()))
        grads = [parse_message(m, self.shapes, self._size) for m in msgs]
        self._record(msgs)
        self.apply(grads)
        self.t += 1
        return 0.0

    # -- digests and evidence ----------------------------------------------------------
    def messages(self, interval: int) -> bytes:
        """``ranks/<i>.msg`` (SPEC §11.6): the interval's messages, rank-major."""
        if self._messages is None:
            raise ValueError("this session does not keep messages")
        return b"".join(m for rank in self._messages.get(interval, []) for m in rank)

    def drop_messages(self, interval: int) -> None:
        """Drop an interval's kept messages once written (its digests stay)."""
        if self._messages is not None:
            self._messages.pop(interval, None)

    def forget(self, interval: int) -> None:
        """Drop an interval's digests and messages once written."""
        self._digests.pop(interval, None)
        if self._messages is not None:
            self._messages.pop(interval, None)

    @property
    def message_size(self) -> int:
        """The byte size of every message of this job."""
        return self._size


def _parse_buffers(data: bytes, like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rank 0's buffers, strictly: this model's buffer names, dtypes and shapes."""
    got = decode_tensors(data, max_tensors=max(1, len(like)))
    if set(got) != set(like) or any(
        got[n].dtype != v.dtype or got[n].shape != v.shape for n, v in like.items()
    ):
        raise FormatError("rank 0's buffers are not this model's")
    return got


def gradient_distance(claimed: Grads, replayed: Grads) -> float:
    """``‖c − r‖₂ / ‖r‖₂`` over the parameters in name order, binary64 fold sums (§1.4).

    ``inf`` when the replayed gradient is zero and the claimed one is not."""
    names = sorted(replayed)
    c = np.concatenate([np.asarray(claimed[n], np.float64).ravel() for n in names])
    r = np.concatenate([np.asarray(replayed[n], np.float64).ravel() for n in names])
    d = c - r
    num, den = math.sqrt(fold_sum_inplace(d * d)), math.sqrt(fold_sum_inplace(r * r))
    if den < np.finfo(np.float64).tiny:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def split_messages(data: bytes, world_size: int, steps: int, size: int) -> list[list[bytes]]:
    """``ranks/<i>.msg`` as ``[rank][step]`` messages (exactly ``W · n · size`` bytes)."""
    if len(data) != world_size * steps * size:
        raise FormatError(
            f"rank messages are {len(data)} bytes, expected {world_size * steps * size}"
        )
    return [
        [data[(r * steps + s) * size : (r * steps + s + 1) * size] for s in range(steps)]
        for r in range(world_size)
    ]


def blame_tolerant(
    session: ParallelTorchSession,
    dataset: Any,
    sampler: Any,
    start: Mapping[str, np.ndarray],
    messages: list[list[bytes]],
    start_step: int,
    end_step: int,
    rtol: float,
) -> tuple[list[int], dict[str, Any]]:
    """The per-rank check of a failing tolerant interval (SPEC §12.6, tolerant mode).

    Follows the committed messages from ``start`` (the state at step ``t`` is ``start``
    advanced by the committed combinations of the steps before it) and at each step
    recomputes every rank's shard gradient. Returns the ranks whose message is farther than
    ``rtol`` (:func:`gradient_distance`) at the **first** step where any is, with figures;
    an empty list when every message is within ``rtol``.

    A message that is not a well-formed gradient message of the job is beyond any bound: its
    rank is blamed at that step (SPEC §12.6).
    """
    session.restore(start, start_step)
    worst = 0.0
    for s, t in enumerate(range(start_step, end_step)):
        idx = sampler.batch(t)
        x = session._augmented(dataset.X[idx])
        mine = session.rank_gradients(x, dataset.y[idx])
        committed: list[Any] = []
        for r in range(session.world_size):
            try:
                committed.append(parse_message(messages[r][s], session.shapes, session._size))
            except FormatError:  # not a gradient message of the job: beyond any bound
                committed.append(None)
        dist = [
            gradient_distance(c, m) if c is not None else math.inf
            for c, m in zip(committed, mine, strict=True)
        ]
        worst = max(worst, *dist)
        bad = [r for r, d in enumerate(dist) if not d <= rtol]
        if bad:
            shown = [d if math.isfinite(d) else None for d in dist]  # None: beyond any bound
            return bad, {"blame_step": t, "rank_grad_distance": shown}
        session.apply(committed)
        session.t += 1
    return [], {"max_rank_grad_distance": worst}


__all__ = [
    "ParallelTorchSession",
    "blame_tolerant",
    "gradient_distance",
    "split_messages",
]
