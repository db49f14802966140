"""Work estimates for an order: FLOPs of the job's training and of its verification (SPEC V §11).

The estimate counts the floating-point operations of one training step of the job's own model
on one batch of the job's shape (forward and backward, counted by PyTorch's
``FlopCounterMode`` over the model graph, plus the optimizer's few operations per parameter),
times the job's steps; verification is the replay of the ``s`` challenged intervals of ``k``
steps each. It is an estimate of work, not of time: the market prices it, escrow locks the
estimated fee, and what the worker's bid does not take is refunded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dk.pol.job import JobSpec

OPTIMIZER_FLOPS_PER_PARAM = {"sgd": 4, "adam": 12, "adamw": 14}


@dataclass(frozen=True)
class WorkEstimate:
    """FLOPs of one step, of the training and of the verification, and the fee they imply."""

    flops_per_step: int
    steps: int
    train_flops: int
    verify_flops: int
    fee: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


def step_flops(job: JobSpec) -> int:
    """FLOPs of one training step of ``job``'s model on one batch (forward + backward + update)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from dk.pol.data import load_dataset
    from dk.pol.models import build_model, num_parameters
    from dk.pol.torch_adapter import make_loss

    dataset = load_dataset(job)
    model = build_model(job)
    n = min(int(job.train["batch_size"]), len(dataset))
    x = torch.from_numpy(dataset.X[:n])
    y = torch.from_numpy(dataset.y[:n])
    loss_fn = make_loss(job, dataset.output_dim)
    counter = FlopCounterMode(display=False)
    with counter:
        loss_fn(model(x), y).backward()
    per_param = OPTIMIZER_FLOPS_PER_PARAM.get(str(job.train.get("optimizer", "sgd")), 12)
    return int(counter.get_total_flops()) + per_param * num_parameters(job.model)


def estimate_work(
    job: JobSpec, *, samples: int, gflop_price: float = 1.0, flops_per_step: int | None = None
) -> WorkEstimate:
    """The work of training ``job`` and of verifying ``samples`` intervals, and its fee.

    Args:
        job: the job.
        samples: challenged intervals a verification replays.
        gflop_price: price of one GFLOP in the market's smallest unit.
        flops_per_step: a measured value to use instead of :func:`step_flops`.
    """
    per_step = step_flops(job) if flops_per_step is None else flops_per_step
    steps = int(job.steps)
    replayed = min(samples, int(job.num_intervals)) * int(job.interval)
    train, verify = per_step * steps, per_step * replayed
    fee = max(1, round((train + verify) / 1e9 * gflop_price))
    return WorkEstimate(per_step, steps, train, verify, fee)


def challenged_bound(m: int, samples: int, topq: int, epochs: int) -> int:
    """At most how many intervals a challenge of ``samples`` uniform draws plus the ``topq``
    largest updates of each of ``epochs`` epochs names: ``min(m, samples + topq * epochs)``."""
    return max(1, min(m, samples + topq * max(1, epochs)))


def job_epochs(job: JobSpec) -> int:
    """Epochs the job's steps span (``ceil(steps / steps_per_epoch)``, SPEC §8)."""
    from dk.pol.data import load_dataset

    per_epoch = max(1, len(load_dataset(job)) // int(job.train["batch_size"]))
    return -(-int(job.steps) // per_epoch)


def order_quote(
    job: JobSpec,
    *,
    gflop_price: float,
    min_stake: int,
    k: int,
    topq: int,
    samples_floor: int,
    max_price: int | None = None,
    samples: int | None = None,
    flops_per_step: int | None = None,
    epochs: int | None = None,
) -> dict[str, Any]:
    """What an order locks in escrow, from the job's work (SPEC V §11).

    ``max_price`` defaults to the training's work, ``ceil(train GFLOP * gflop_price)``. The
    verification fee covers ``k`` validators replaying the largest challenge the order can
    draw: ``E = challenged_bound(m, s, topq, epochs)`` intervals, where ``s`` is the order's
    ``samples`` or, when the economic default will fix it, its value at ``max_price`` and
    ``min_stake`` (the matched price is at most ``max_price`` and the stake at least
    ``min_stake``, so the fixed ``s`` is no larger); ``fee = ceil(k * E * interval * flops per
    step / 1e9 * gflop_price)``. The release pays only the part the verification used.
    """
    import math

    from dk.market.economics import order_samples

    per_step = step_flops(job) if flops_per_step is None else flops_per_step
    m, interval, steps = int(job.num_intervals), int(job.interval), int(job.steps)
    price = max_price or max(1, math.ceil(per_step * steps / 1e9 * gflop_price))
    s = samples if samples is not None else order_samples(m, price, min_stake, samples_floor)
    e = challenged_bound(m, s, topq, job_epochs(job) if epochs is None else epochs)
    verify_flops = k * e * interval * per_step
    return {
        "max_price": price,
        "fee": max(1, math.ceil(verify_flops / 1e9 * gflop_price)),
        "fee_intervals": e,
        "samples_bound": s,
        "flops_per_step": per_step,
        "train_flops": per_step * steps,
        "verify_flops": verify_flops,
        "gflop_price": gflop_price,
    }
