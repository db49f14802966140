"""The replay's optimizer (``dk.pol.replay_optim``) has torch's optimizer classes' bits, and a
replay on torch never imports ``torch._dynamo`` (a fixed cost of every verification)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dk.pol import default_job  # noqa: E402
from dk.pol.data import load_dataset  # noqa: E402
from dk.pol.models import build_fresh  # noqa: E402
from dk.pol.replay_optim import ReplayOptimizer  # noqa: E402
from dk.pol.sampler import job_sampler  # noqa: E402
from dk.pol.torch_adapter import (  # noqa: E402
    job_batch,
    make_loss,
    make_optimizer,
    restore,
    snapshot,
    train_step,
)

OPTIMIZERS = [
    ("sgd", {"momentum": 0.9, "weight_decay": 1e-3}),
    ("sgd", {"momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}),
    ("sgd", {"momentum": 0.0}),
    ("adam", {"weight_decay": 1e-3}),
    ("adamw", {"weight_decay": 0.05}),
]


def _job(optimizer: str, train: dict[str, Any]) -> Any:
    return default_job(
        arch="cnn",
        mode="tolerant",
        steps=8,
        interval=4,
        batch_size=16,
        seed=3,
        optimizer=optimizer,
        lr=0.05 if optimizer == "sgd" else 1e-3,
        train={"clip_norm": 1.0, **train},
    )


def _steps(job: Any, model: Any, opt: Any, a: int, b: int) -> list[float]:
    ds = load_dataset(job)
    sampler = job_sampler(job, len(ds))
    loss_fn = make_loss(job, ds.output_dim)
    losses = []
    for t in range(a, b):
        x, y = job_batch(job, ds, sampler, t)
        losses.append(train_step(model, opt, loss_fn, x, y, job=job, step=t))
    return losses


@pytest.mark.parametrize(("optimizer", "train"), OPTIMIZERS)
def test_same_bits_as_the_torch_class(optimizer: str, train: dict[str, Any]) -> None:
    """Train 4 steps with the torch class, then 4 more with each optimizer from that
    checkpoint (restored into a fresh model, as a replay does): every tensor of the end
    checkpoint (weights, buffers, optimizer state) and every loss are bit-identical."""
    torch.manual_seed(0)
    job = _job(optimizer, train)
    spe = job_sampler(job, len(load_dataset(job))).steps_per_epoch
    model = build_fresh(job)
    ref = make_optimizer(job, model.parameters())
    _steps(job, model, ref, 0, 4)
    start = snapshot(model, ref, job, 4, spe)
    ends, losses = [], []
    for make in (make_optimizer, ReplayOptimizer):
        m = build_fresh(job)
        opt = make(job, m.parameters())
        restore(start, m, opt, job)
        losses.append(_steps(job, m, opt, 4, 8))
        ends.append(snapshot(m, opt, job, 8, spe))
    assert losses[0] == losses[1]
    assert sorted(ends[0]) == sorted(ends[1])
    for k, v in ends[0].items():
        assert v.dtype == ends[1][k].dtype and v.tobytes() == ends[1][k].tobytes(), k
    assert not np.array_equal(start["model/fc0.weight"], ends[0]["model/fc0.weight"])


def test_state_starts_as_the_torch_class_does() -> None:
    """Adam from an empty state (checkpoint 0 holds none): the first steps match too."""
    torch.manual_seed(0)
    job = _job("adam", {})
    outs = []
    for make in (make_optimizer, ReplayOptimizer):
        torch.manual_seed(1)
        m = build_fresh(job)
        opt = make(job, m.parameters())
        _steps(job, m, opt, 0, 3)
        outs.append(snapshot(m, opt, job, 3, 1000))
    for k, v in outs[0].items():
        assert v.tobytes() == outs[1][k].tobytes(), k


def test_zero_grad_keeps_or_drops_gradients() -> None:
    p = torch.nn.Parameter(torch.ones(3))
    opt = ReplayOptimizer(_job("sgd", {"momentum": 0.9}), [p])
    p.grad = torch.ones(3)
    opt.zero_grad(set_to_none=False)
    assert p.grad is not None and not p.grad.any()
    opt.zero_grad()
    assert p.grad is None
    with pytest.raises(ValueError, match="empty"):
        ReplayOptimizer(_job("sgd", {"momentum": 0.9}), [])


def test_a_tolerant_replay_never_imports_torch_dynamo(tmp_path: Path) -> None:
    """``torch._dynamo`` costs ~1.8 s of CPU per verification: building the replay's optimizer,
    stepping it and leaving the replay's thread settings must not import it (a fresh process,
    since other tests import it; the job is made here: making one calibrates it)."""
    job = default_job(arch="cnn", mode="tolerant", steps=4, interval=2, batch_size=8,
                      optimizer="sgd", train={"nesterov": True, "momentum": 0.9})  # fmt: skip
    (tmp_path / "job.toml").write_text(job.to_toml())
    code = textwrap.dedent(
        """
        import sys
        from dk.pol.checkpoint import initial_checkpoint
        from dk.pol.data import load_dataset
        from dk.pol.job import load_job
        from dk.pol.replay import make_replayer
        job = load_job("job.toml")
        r = make_replayer(job, load_dataset(job))
        end = r.run(initial_checkpoint(job, r.sampler.steps_per_epoch), 0, 2)
        assert int(end["meta/step"]) == 2
        print("torch._dynamo" in sys.modules, "torch" in sys.modules)
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=tmp_path,
    )
    assert out.stdout.split() == ["False", "True"], out.stderr
