"""Replayable DP-SGD (SPEC Part VII §4): per-sample clipping and noise from the job's stream.

A job with ``[train.dp]`` trains each step as DP-SGD (Abadi et al., CCS 2016), the way Opacus'
``DPOptimizer`` does: per-sample gradients (``torch.func``), each clipped to L2 norm
``max_grad_norm`` over all parameters (factor ``min(1, C / (‖g_i‖ + 1e-6))``), summed, plus
Gaussian noise of standard deviation ``noise_multiplier · C`` per coordinate, divided by the batch
size. The noise of step ``t`` comes from a torch CPU generator seeded with the first 8 bytes
(little-endian, top bit cleared) of ``stream_key("dp-noise", job seed, u64(t))``, drawn parameter
by parameter in registration order, so a verifier replays the noisy step bit for bit on the same
torch build. ε at δ comes from Opacus' RDP accountant with sample rate ``batch_size / n``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from dk.crypto.hashing import u64
from dk.crypto.stream import stream_key
from dk.errors import BackendUnavailable, FormatError

if TYPE_CHECKING:
    from dk.pol.job import JobSpec

DP_KEYS = ("noise_multiplier", "target_epsilon", "delta", "max_grad_norm", "accountant")
ACCOUNTANTS = ("rdp",)


def _fail(msg: str) -> FormatError:
    return FormatError(f"job: train.dp.{msg}", reason="JOB_MALFORMED")


def normalize_dp(dp: Any) -> dict[str, Any]:
    """Validate ``train.dp`` and fill its defaults (``target_epsilon`` 0 = no ceiling)."""
    if not isinstance(dp, dict):
        raise _fail("must be a table")
    for k in dp:
        if k not in DP_KEYS:
            raise _fail(f"{k} is not a DP setting ({', '.join(DP_KEYS)})")
    out = {"target_epsilon": 0.0, "accountant": "rdp", **dp}
    for key, lo, hi in (
        ("noise_multiplier", 0.0, 1e4),
        ("max_grad_norm", 1e-12, 1e6),
        ("delta", 1e-300, 1.0),
        ("target_epsilon", 0.0, 1e6),
    ):
        if key not in out:
            raise _fail(
                f"{key} is required"
                + (" (dk.pol.dp.noise_for_target computes it)" if key == "noise_multiplier" else "")
            )
        v = out[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise _fail(f"{key} must be a number")
        if not lo <= float(v) < hi:
            raise _fail(f"{key} must be in [{lo}, {hi})")
        out[key] = float(v)
    if out["accountant"] not in ACCOUNTANTS:
        raise _fail(f"accountant must be one of {', '.join(ACCOUNTANTS)}")
    return out


def _opacus() -> Any:
    try:
        import opacus.accountants
    except ImportError as e:
        raise BackendUnavailable("DP-SGD jobs need Opacus: pip install 'dk-pol[dp]'") from e
    return opacus


def epsilon(dp: dict[str, Any], *, batch_size: int, n: int, steps: int) -> float:
    """ε at ``dp['delta']`` after ``steps`` steps (Opacus' accountant)."""
    _opacus()
    from opacus.accountants import RDPAccountant

    if dp["noise_multiplier"] == 0.0:
        return math.inf
    acc = RDPAccountant()
    acc.history = [(dp["noise_multiplier"], min(1.0, batch_size / n), steps)]
    return float(acc.get_epsilon(delta=dp["delta"]))


def noise_for_target(
    target_epsilon: float, delta: float, *, batch_size: int, n: int, steps: int
) -> float:
    """The noise multiplier that reaches ``target_epsilon`` at ``delta`` (Opacus)."""
    _opacus()
    from opacus.accountants.utils import get_noise_multiplier

    return float(
        get_noise_multiplier(
            target_epsilon=target_epsilon,
            target_delta=delta,
            sample_rate=min(1.0, batch_size / n),
            steps=steps,
            accountant="rdp",
        )
    )


def check_budget(job: JobSpec, n: int) -> float:
    """ε of the whole job; ``FormatError`` above ``target_epsilon`` (checked before training)."""
    dp = job.train["dp"]
    eps = epsilon(dp, batch_size=int(job.train["batch_size"]), n=n, steps=job.steps)
    if dp["target_epsilon"] > 0 and not eps <= dp["target_epsilon"]:
        raise FormatError(
            f"job: DP parameters give ε = {eps:.4g} at δ = {dp['delta']:g} over {job.steps} steps, "
            f"above train.dp.target_epsilon = {dp['target_epsilon']:g}",
            reason="JOB_MALFORMED",
        )
    return eps


def noise_seed(seed: int, step: int) -> int:
    """The torch generator seed of step ``step``'s noise."""
    return int.from_bytes(stream_key("dp-noise", seed, u64(step))[:8], "little") & ((1 << 63) - 1)


def dp_grads_(
    model: Any, loss_fn: Any, x: Any, y: Any, *, dp: dict[str, Any], seed: int, step: int
) -> None:
    """Overwrite ``p.grad`` of every parameter with the DP-SGD gradient of this batch."""
    import torch
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(p: dict[str, Any], xi: Any, yi: Any) -> Any:
        return loss_fn(functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    per = vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x, y)
    b = x.shape[0]
    sq = torch.zeros(b, dtype=torch.float32)
    for name in params:
        sq = sq + per[name].reshape(b, -1).pow(2).sum(1)
    c = dp["max_grad_norm"]
    factor = (c / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    gen = torch.Generator().manual_seed(noise_seed(seed, step))
    std = dp["noise_multiplier"] * c
    for name, p in model.named_parameters():
        g = (factor.reshape(b, *([1] * p.dim())) * per[name]).sum(0)
        noise = torch.normal(0.0, std, size=tuple(p.shape), generator=gen)
        p.grad = (g + noise) / b
