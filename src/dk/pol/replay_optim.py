"""The job's optimizer for the verifier's replays, without ``torch.optim.Optimizer`` (SPEC §12.4).

torch's optimizer classes import ``torch._dynamo`` (about 1.8 s of CPU in a fresh process) when
one is built (``add_param_group``) and in every ``step`` and ``zero_grad``, only to exempt
themselves from compilation. A replay never compiles, so :class:`ReplayOptimizer` calls the
functional updates the classes call (``torch.optim.sgd.sgd``, ``torch.optim.adam.adam``) with
the arguments the classes pass for the optimizer :func:`dk.pol.torch_adapter.make_optimizer`
builds (single-tensor, ``foreach=False``), and keeps the per-parameter state under the classes'
keys, so :func:`~dk.pol.torch_adapter.restore`, :func:`~dk.pol.torch_adapter.snapshot` and
:func:`~dk.pol.torch_adapter.train_step` use it unchanged. The arithmetic is torch's own: the
updated parameters and state have the classes' bits (``tests/unit/pol/test_replay_optim.py``
compares them on every optimizer a job can name).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from dk.pol.job import JobSpec


def _groups(job: JobSpec) -> dict[str, Any]:
    """The group options ``make_optimizer``'s torch class holds for the job (its defaults)."""
    t = job.train
    if t["optimizer"] == "sgd":
        return {
            "lr": t["lr"],
            "momentum": t["momentum"],
            "dampening": 0,
            "weight_decay": t["weight_decay"],
            "nesterov": bool(t.get("nesterov", False)),
            "maximize": False,
            "foreach": False,
            "differentiable": False,
            "fused": None,
        }
    b1, b2 = (float(b) for b in t["betas"])
    return {
        "lr": t["lr"],
        "betas": (b1, b2),
        "eps": t["eps"],
        "weight_decay": t["weight_decay"],
        "amsgrad": False,
        "maximize": False,
        "foreach": False,
        "capturable": False,
        "differentiable": False,
        "fused": None,
        "decoupled_weight_decay": t["optimizer"] == "adamw",
    }


class ReplayOptimizer:
    """SGD (momentum, Nesterov), Adam or AdamW as the job names them, for replays only.

    The interface the replay uses: ``param_groups`` (one group; ``lr`` is set per step),
    ``state`` (per parameter, the torch class's keys), ``zero_grad`` and ``step``.
    """

    def __init__(self, job: JobSpec, params: Any) -> None:
        self.kind = str(job.train["optimizer"])
        if self.kind not in ("sgd", "adam", "adamw"):
            raise ValueError(f"unknown optimizer {self.kind!r}")
        self.defaults = _groups(job)
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        self.param_groups: list[dict[str, Any]] = [{"params": params, **self.defaults}]
        self.state: defaultdict[torch.Tensor, dict[str, Any]] = defaultdict(dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) every parameter's gradient, as ``Optimizer.zero_grad`` does."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    def step(self) -> None:
        """One update of every group, without autograd (``Optimizer.step``)."""
        with torch.no_grad():
            for group in self.param_groups:
                if self.kind == "sgd":
                    self._sgd(group)
                else:
                    self._adam(group)

    def _sgd(self, group: dict[str, Any]) -> None:
        # torch.optim.SGD._init_group and step (torch 2.13), non-fused
        from torch.optim.sgd import sgd

        params, grads, bufs = [], [], []
        sparse = False
        for p in group["params"]:
            if p.grad is not None:
                params.append(p)
                grads.append(p.grad)
                sparse = sparse or p.grad.is_sparse
                if group["momentum"] != 0:
                    bufs.append(self.state[p].get("momentum_buffer"))
        sgd(
            params,
            grads,
            bufs,
            weight_decay=group["weight_decay"],
            momentum=group["momentum"],
            lr=group["lr"],
            dampening=group["dampening"],
            nesterov=group["nesterov"],
            maximize=group["maximize"],
            has_sparse_grad=sparse,
            foreach=group["foreach"],
            fused=group["fused"],
            grad_scale=None,
            found_inf=None,
        )
        if group["momentum"] != 0:
            for p, buf in zip(params, bufs, strict=True):
                self.state[p]["momentum_buffer"] = buf

    def _adam(self, group: dict[str, Any]) -> None:
        # torch.optim.Adam._init_group and step (torch 2.13; AdamW is Adam with decoupled
        # weight decay), neither capturable nor fused: ``step`` is a float32 CPU scalar
        from torch.optim.adam import adam

        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        has_complex = False
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("Adam does not support sparse gradients")
            has_complex |= torch.is_complex(p)
            params.append(p)
            grads.append(p.grad)
            state = self.state[p]
            if len(state) == 0:
                state["step"] = torch.tensor(0.0, dtype=_scalar_dtype(), device="cpu")
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        beta1, beta2 = group["betas"]
        adam(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],
            steps,
            amsgrad=group["amsgrad"],
            has_complex=has_complex,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=group["maximize"],
            foreach=group["foreach"],
            capturable=group["capturable"],
            differentiable=group["differentiable"],
            fused=group["fused"],
            grad_scale=None,
            found_inf=None,
            decoupled_weight_decay=group["decoupled_weight_decay"],
        )


def _scalar_dtype() -> torch.dtype:
    # torch.optim.optimizer._get_scalar_dtype: float64 under a float64 default dtype
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
