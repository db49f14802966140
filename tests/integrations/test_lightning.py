"""DkCallback: a Lightning fit records a bundle that proves and verifies; deviations are refused
(JobMismatch at fit start) or rejected by the verifier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

L = pytest.importorskip("lightning")

from dk.errors import JobMismatch  # noqa: E402
from dk.integrations.lightning import DkCallback  # noqa: E402
from dk.pol import Recorder, build_model  # noqa: E402
from dk.pol.schedule import make_scheduler  # noqa: E402
from dk.pol.torch_adapter import make_optimizer  # noqa: E402

from .common import prove_and_verify, small_job  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning"
)


class Module(L.LightningModule):  # type: ignore[misc]
    """An ordinary LightningModule holding the job's model (automatic optimization)."""

    def __init__(self, job: Any, *, lr_scale: float = 1.0, ascent: bool = False) -> None:
        super().__init__()
        self.job, self.net, self.lr_scale, self.ascent = job, build_model(job), lr_scale, ascent

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        return -loss if self.ascent else loss

    def configure_optimizers(self) -> Any:
        t = self.job.train
        opt = torch.optim.SGD(
            self.net.parameters(),
            lr=t["lr"] * self.lr_scale,
            momentum=t["momentum"],
            nesterov=t["nesterov"],
            weight_decay=t["weight_decay"],
            foreach=False,
        )
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=t["step_size"], gamma=t["gamma"])
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class ManualModule(Module):
    """The same module with manual optimization: its own zero_grad, backward, step."""

    def __init__(self, job: Any) -> None:
        super().__init__(job)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt, sched = self.optimizers(), self.lr_schedulers()
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        sched.step()
        return loss


def _fit(job: Any, run: Path, module: Any = None, **trainer: Any) -> DkCallback:
    module = module if module is not None else Module(job)
    cb = DkCallback(Recorder(job, run), model=module.net)
    args: dict[str, Any] = {
        "max_steps": job.steps,
        "accumulate_grad_batches": job.train["accumulation"],
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    args.update(trainer)
    L.Trainer(callbacks=[cb], **args).fit(module, train_dataloaders=cb.loader())
    return cb


@pytest.mark.parametrize("accumulation", [1, 2])
def test_lightning_fit_records_a_bundle_that_verifies(tmp_path: Path, accumulation: int) -> None:
    job = small_job(accumulation=accumulation)
    cb = _fit(job, tmp_path / "run")
    assert cb.info is not None and cb.info.complete
    assert [c.step for c in cb.info.checkpoints] == [0, 4, 8]
    assert all(iv.ext and iv.ext["loss"] > 0 for iv in cb.info.intervals)
    report = prove_and_verify(job, tmp_path / "run")
    assert report.ok, report.to_dict()
    assert report.challenged == [0, 1]


def test_a_bf16_job_under_bf16_mixed_verifies(tmp_path: Path) -> None:
    """Lightning's own autocast is the job's precision (the Recorder checks every forward)."""
    job = small_job(precision="bf16")
    _fit(job, tmp_path / "run", precision="bf16-mixed")
    report = prove_and_verify(job, tmp_path / "run")
    assert report.ok, report.to_dict()


def test_manual_optimization_verifies(tmp_path: Path) -> None:
    job = small_job()
    _fit(job, tmp_path / "run", ManualModule(job))
    report = prove_and_verify(job, tmp_path / "run")
    assert report.ok, report.to_dict()


def test_the_same_run_as_a_plain_loop(tmp_path: Path) -> None:
    """Lightning's closure path trains the very weights a plain loop with the Recorder does."""
    job = small_job()
    cb = _fit(job, tmp_path / "run")
    net = build_model(job)
    opt = make_optimizer(job, net.parameters())
    sched = make_scheduler(job, opt)
    rec = Recorder(job, tmp_path / "plain")
    net, opt, loader = rec.attach(model=net, optimizer=opt, scheduler=sched)
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
        sched.step()
    plain = rec.finish()
    assert [c.root for c in cb.info.checkpoints] == [c.root for c in plain.checkpoints]


def test_a_different_learning_rate_is_refused(tmp_path: Path) -> None:
    job = small_job()
    with pytest.raises(JobMismatch, match=r"scheduler gives lr 0\.1 at step 0"):
        _fit(job, tmp_path / "run", Module(job, lr_scale=2.0))
    assert not (tmp_path / "run" / "run.json").exists()


@pytest.mark.parametrize(
    ("trainer", "match"),
    [
        ({"gradient_clip_val": 1.0}, "gradient_clip_val"),
        ({"max_steps": 4}, "max_steps"),
        ({"accumulate_grad_batches": 2}, "accumulate_grad_batches"),
        ({"precision": "bf16-mixed"}, "precision"),
    ],
)
def test_a_trainer_that_is_not_the_job_is_refused(
    tmp_path: Path, trainer: dict[str, Any], match: str
) -> None:
    with pytest.raises(JobMismatch, match=match):
        _fit(small_job(), tmp_path / "run", **trainer)


def test_a_deviating_loop_is_rejected_by_the_verifier(tmp_path: Path) -> None:
    """Gradient ascent records (tolerant mode does not see the user's gradients) and proves,
    but no challenged interval replays."""
    job = small_job()
    _fit(job, tmp_path / "run", Module(job, ascent=True))
    report = prove_and_verify(job, tmp_path / "run")
    assert report.verdict == "reject"
    assert "REPLAY_MISMATCH" in report.codes
