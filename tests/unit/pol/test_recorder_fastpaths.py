"""The Recorder's per-step fast paths give what the plain calls give, bit for bit."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dk.pol.augment import generator, seed_step, step_seed
from dk.pol.recorder import Recorder, TrainingDiverged
from dk.pol.torch_adapter import clip_gradients

torch.set_num_threads(1)


def _params(seed: int, scale: float) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(7,), (3, 5), (300, 300), (1,), (2, 3, 4)]
    ps = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g) * (1.0 if math.isnan(scale) else scale)
    if math.isnan(scale):  # one NaN: the total norm is NaN, the other gradients finite
        assert ps[1].grad is not None
        ps[1].grad[1, 2] = scale
    return ps


def _clip_with_recorder(ps: list[torch.nn.Parameter], clip: float) -> None:
    fake: Any = SimpleNamespace(job=SimpleNamespace(train={"clip_norm": clip}), _params=ps)
    Recorder._clip_gradients(fake)


@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e3, float("nan")])
@pytest.mark.parametrize("clip", [0.0, 0.5, 1e6])
def test_clipping_is_the_jobs_clipping(scale: float, clip: float) -> None:
    """Below, at and above the threshold, NaN gradients, and clipping off."""
    for seed in range(3):
        a, b = _params(seed, scale), _params(seed, scale)
        clip_gradients(SimpleNamespace(train={"clip_norm": clip}), a)  # type: ignore[arg-type]
        _clip_with_recorder(b, clip)
        for x, y in zip(a, b, strict=True):
            assert x.grad is not None and y.grad is not None
            assert torch.equal(x.grad.view(torch.int32), y.grad.view(torch.int32))


def _checker(ps: list[torch.nn.Parameter]) -> Any:
    return SimpleNamespace(
        _params=ps,
        _param_names=[f"p{i}" for i in range(len(ps))],
        step=4,
        _ckpt_steps=[0, 2, 4],
        _next=2,
    )


@pytest.mark.parametrize("where", [0, 2])  # a small (concatenated) and a large (summed) tensor
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_stop_recording(where: int, bad: float) -> None:
    ps = _params(0, 1.0)
    Recorder._check_finite(_checker(ps))  # finite: nothing
    with torch.no_grad():
        ps[where].view(-1)[-1] = bad
    with pytest.raises(TrainingDiverged, match=f"step 4: the update made \\['p{where}'\\]"):
        Recorder._check_finite(_checker(ps))


def test_finite_weights_whose_sum_overflows_are_not_a_divergence() -> None:
    ps = _params(0, 1.0)
    with torch.no_grad():
        ps[2].fill_(3e38)  # finite, but its float32 sum is infinite
        ps[0].fill_(3e38)
    Recorder._check_finite(_checker(ps))


def test_step_seed_seeds_what_torch_manual_seed_seeds() -> None:
    for step, micro in ((0, 0), (5, 1), (123456, 3)):
        torch.manual_seed(step_seed(7, step, micro))
        want = torch.rand(64)
        seed_step(7, step, micro)
        assert torch.equal(torch.rand(64), want)
        assert torch.equal(torch.rand(8, generator=generator()), want[:8])


def test_seed_step_does_not_queue_lazy_cuda_seeding(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.manual_seed captures a stack trace per accelerator per call before CUDA starts."""
    import traceback

    calls: list[int] = []
    real = traceback.format_stack
    monkeypatch.setattr(traceback, "format_stack", lambda *a, **k: calls.append(1) or real())
    seed_step(0, 1, 0)
    assert calls == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_seed_step_seeds_cuda_once_initialised() -> None:
    torch.cuda.init()
    torch.manual_seed(step_seed(7, 3, 0))
    want = torch.rand(16, device="cuda")
    seed_step(7, 3, 0)
    assert torch.equal(torch.rand(16, device="cuda"), want)
