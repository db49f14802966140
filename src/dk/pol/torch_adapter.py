"""PyTorch adapter: optimizer, loss, snapshot/restore and the canonical training step.

One training step, the same in ``dk train``, a user's loop under :class:`~dk.pol.Recorder`
and the verifier's replay::

    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dk.pol.checkpoint import Tensors, hparam_tensors, meta_tensors


def make_optimizer(job: Any, params: Any) -> torch.optim.Optimizer:
    """The job's optimizer over ``params`` (single-tensor implementation, never foreach)."""
    t = job.train
    if t["optimizer"] == "sgd":
        return torch.optim.SGD(
            params,
            lr=t["lr"],
            momentum=t["momentum"],
            weight_decay=t["weight_decay"],
            foreach=False,
        )
    return torch.optim.Adam(
        params,
        lr=t["lr"],
        betas=tuple(t["betas"]),
        eps=t["eps"],
        weight_decay=t["weight_decay"],
        foreach=False,
    )


def make_loss(job: Any, output_dim: int) -> Any:
    """The job's loss as ``f(logits, y) -> scalar`` (mean over the batch)."""
    if job.train["loss"] == "cross_entropy":
        return lambda out, y: F.cross_entropy(out, y)

    def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        target = F.one_hot(y, output_dim).to(out.dtype) if y.dtype == torch.int64 else y
        return F.mse_loss(out, target)

    return mse


@contextlib.contextmanager
def deterministic(threads: int | None = 1) -> Iterator[None]:
    """Pin torch to ``threads`` intra-op threads and deterministic algorithms, then restore."""
    old_threads = torch.get_num_threads()
    old_det = torch.are_deterministic_algorithms_enabled()
    if threads is not None:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)


_STATE_KEYS = {"sgd": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq", "step")}


def make_codec(job: Any) -> Any:
    """The job's gradient codec state machine, or None without compression (SPEC §10.1)."""
    spec = job.train.get("compression", "")
    if not spec:
        return None
    from dk.compress import CompressedSGDStep

    return CompressedSGDStep(spec)


def compress_hook(codec: Any) -> Any:
    """A ``grad_hook`` for :func:`train_step` that compresses gradients with ``codec``."""
    if codec is None:
        return None
    return lambda model: codec.compress_grads_(model.named_parameters())


def snapshot(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    job: Any,
    step: int,
    steps_per_epoch: int,
    codec: Any = None,
) -> Tensors:
    """Copy the training state at ``step`` into a checkpoint tensor set (SPEC §10.1)."""
    ck: Tensors = {}
    for name, p in model.named_parameters():
        ck[f"model/{name}"] = p.detach().numpy().copy()
        state = optimizer.state.get(p, {})
        for key in _STATE_KEYS[job.train["optimizer"]]:
            v = state.get(key)
            if v is not None:
                ck[f"optim/{name}/{key}"] = v.detach().numpy().astype(np.float32, copy=True)
    ck.update(hparam_tensors(job))
    ck.update(meta_tensors(job, step, steps_per_epoch))
    if codec is not None:
        ck.update(codec.state_dict())
    return ck


def restore(
    ck: Mapping[str, np.ndarray],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    job: Any,
    codec: Any = None,
) -> None:
    """Load a checkpoint's weights, optimizer state and codec state."""
    if codec is not None:
        codec.load_state_dict(ck)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(np.array(ck[f"model/{name}"])))
            optimizer.state.pop(p, None)
            state = {}
            for key in _STATE_KEYS[job.train["optimizer"]]:
                v = ck.get(f"optim/{name}/{key}")
                if v is not None:
                    state[key] = torch.from_numpy(np.array(v, dtype=np.float32))
            if state:
                optimizer.state[p] = state


def batch_tensors(dataset: Any, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch at ``indices`` as torch tensors."""
    return torch.from_numpy(dataset.X[indices]), torch.from_numpy(dataset.y[indices])


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    grad_hook: Any = None,
) -> float:
    """One canonical step; ``grad_hook(model)`` may transform gradients before the update."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    if grad_hook is not None:
        grad_hook(model)
    optimizer.step()
    return float(loss.detach())
