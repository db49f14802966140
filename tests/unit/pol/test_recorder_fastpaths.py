"""The Recorder's per-step fast paths give what the plain calls give, bit for bit."""

from __future__ import annotations

import functools
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


def _clip_with_recorder(ps: list[torch.nn.Parameter], clip: float, rounding: Any = None) -> None:
    # ``rounding`` set: the rounded backend's path (per-tensor norms, as its log names them)
    job = SimpleNamespace(train={"clip_norm": clip})
    fake: Any = SimpleNamespace(job=job, _params=ps, rounding=rounding, step=0, _clip_warned=False)
    fake._warn_if_clipped_twice = functools.partial(Recorder._warn_if_clipped_twice, fake)
    Recorder._clip_gradients(fake)


@pytest.mark.parametrize("rounded", [False, True])
@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e3, float("nan")])
@pytest.mark.parametrize("clip", [0.0, 0.5, 1e6])
def test_clipping_is_the_jobs_clipping(scale: float, clip: float, rounded: bool) -> None:
    """Below, at and above the threshold, NaN gradients, and clipping off (both paths)."""
    for seed in range(3):
        a, b = _params(seed, scale), _params(seed, scale)
        clip_gradients(SimpleNamespace(train={"clip_norm": clip}), a)  # type: ignore[arg-type]
        _clip_with_recorder(b, clip, object() if rounded else None)
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


def test_weights_moved_to_new_storage_are_still_checked() -> None:
    """The flat views are remade when a parameter's storage moves (``p.data = ...``)."""
    ps = _params(0, 1.0)
    rec = _checker(ps)
    Recorder._check_finite(rec)
    ps[1].data = ps[1].data.clone()
    ps[1].data[0, 0] = float("nan")
    with pytest.raises(TrainingDiverged, match="p1"):
        Recorder._check_finite(rec)


def test_mixed_dtype_weights_are_checked() -> None:
    ps = _params(0, 1.0)
    ps[0].data = ps[0].data.double()
    Recorder._check_finite(_checker(ps))
    ps[0].data[3] = float("inf")
    with pytest.raises(TrainingDiverged, match="p0"):
        Recorder._check_finite(_checker(ps))


@pytest.mark.parametrize("kind", ["cross_entropy", "next_token_cross_entropy", "mse"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_loss_under_cpu_autocast_is_the_float32_loss(kind: str, smoothing: float) -> None:
    """The Recorder computes the loss under the user's CPU autocast: the same bits as without
    it (the loss ops are not lowered on the CPU; a torch release that changes it fails here)."""
    from dk.pol.torch_adapter import make_loss

    job = SimpleNamespace(train={"loss": kind, "label_smoothing": smoothing})
    fn = make_loss(job, 10)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(3)
    if kind == "next_token_cross_entropy":
        out, y = torch.randn(4, 16, 10, generator=g), torch.randint(0, 10, (4, 16), generator=g)
    else:
        out, y = torch.randn(32, 10, generator=g), torch.randint(0, 10, (32,), generator=g)
    want = fn(out, y)
    for dt in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dt):
            got = fn(out, y)
        assert got.dtype == torch.float32
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("acc", [1, 2, 3, 7])
def test_loss_meter_divides_like_the_step(acc: int) -> None:
    """``LossMeter`` divides the stacked float32 losses once per interval: the bits of each
    0-d ``loss / acc`` that the step back-propagates (SPEC §11.7)."""
    from dk.pol.loss import LossMeter, interval_loss, step_loss

    g = torch.Generator().manual_seed(acc)
    vals = (torch.rand(5, acc, generator=g) * 7).unbind(0)
    m = LossMeter(acc)
    for row in vals:
        for v in row.unbind(0):
            m.add(v)
        m.end_step()
    want = interval_loss([step_loss([float(v / acc) for v in row.unbind(0)]) for row in vals])
    assert m.take() == want
    n = LossMeter(acc)  # numbers (a step engine's losses): divided in float32 too
    for row in vals:
        for v in row.unbind(0):
            n.add(float(v))
        n.end_step()
    assert n.take() == want


def test_block_derived_step_seeds_are_the_step_seeds() -> None:
    rec: Any = SimpleNamespace(
        job=SimpleNamespace(train={"accumulation": 2}),
        _seed=11,
        _seeds=(0, 0, []),
        _derive_seed=step_seed,
    )
    for step, micro in ((0, 0), (0, 1), (63, 1), (64, 0), (70, 2), (3, 0), (200, 1)):
        assert Recorder._step_seed(rec, step, micro) == step_seed(11, step, micro)
