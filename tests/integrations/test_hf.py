"""DkTrainerCallback: a transformers.Trainer run records a bundle that proves and verifies;
deviations are refused (JobMismatch at train start) or rejected by the verifier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from dk.errors import JobMismatch  # noqa: E402
from dk.integrations.hf import DkTrainerCallback, JobModel  # noqa: E402
from dk.pol import Recorder, build_model  # noqa: E402

from .common import prove_and_verify, small_job  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


class MSEModel(JobModel):
    """A user's model whose loss is not the job's (MSE on one-hot targets)."""

    def forward(self, input: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.model(input)
        return {"loss": F.mse_loss(logits, F.one_hot(labels, 10).float()), "logits": logits}


def _train(
    job: Any,
    run: Path,
    *,
    lr_scale: float = 1.0,
    own_scheduler: bool = True,
    wrapper: type[JobModel] = JobModel,
    dataset: Any = None,
    **args: Any,
) -> DkTrainerCallback:
    t = job.train
    net = build_model(job)
    opt = torch.optim.SGD(
        net.parameters(),
        lr=t["lr"] * lr_scale,
        momentum=t["momentum"],
        nesterov=t["nesterov"],
        weight_decay=t["weight_decay"],
        foreach=False,
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=t["step_size"], gamma=t["gamma"])
    cb = DkTrainerCallback(Recorder(job, run), model=net)
    kw: dict[str, Any] = {
        "output_dir": str(run.parent / "hf"),
        "max_steps": job.steps,
        "per_device_train_batch_size": t["batch_size"] // t["accumulation"],
        "gradient_accumulation_steps": t["accumulation"],
        "max_grad_norm": 0.0,
        "use_cpu": True,
        "report_to": [],
        "save_strategy": "no",
        "logging_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    kw.update(args)
    trainer = transformers.Trainer(
        model=wrapper(net, job),
        args=transformers.TrainingArguments(**kw),
        train_dataset=dataset if dataset is not None else cb.train_dataset(),
        optimizers=(opt, sched if own_scheduler else None),
        callbacks=[cb],
    )
    trainer.train()
    return cb


@pytest.mark.parametrize("accumulation", [1, 2])
def test_trainer_records_a_bundle_that_verifies(tmp_path: Path, accumulation: int) -> None:
    job = small_job(accumulation=accumulation)
    cb = _train(job, tmp_path / "run")
    assert cb.info is not None and cb.info.complete
    assert [c.step for c in cb.info.checkpoints] == [0, 4, 8]
    report = prove_and_verify(job, tmp_path / "run")
    assert report.ok, report.to_dict()
    assert report.challenged == [0, 1]


def test_a_bf16_job_with_bf16_arguments_verifies(tmp_path: Path) -> None:
    """The Trainer's own autocast is the job's precision (the Recorder checks every forward)."""
    job = small_job(precision="bf16")
    _train(job, tmp_path / "run", bf16=True)
    report = prove_and_verify(job, tmp_path / "run")
    assert report.ok, report.to_dict()


def test_a_different_learning_rate_is_refused(tmp_path: Path) -> None:
    with pytest.raises(JobMismatch, match=r"scheduler gives lr 0\.1 at step 0"):
        _train(small_job(), tmp_path / "run", lr_scale=2.0)
    assert not (tmp_path / "run" / "run.json").exists()


def test_the_trainers_default_schedule_is_refused(tmp_path: Path) -> None:
    """No scheduler passed: the Trainer's linear decay is not the job's step decay."""
    with pytest.raises(JobMismatch, match="step schedule says"):
        _train(small_job(), tmp_path / "run", own_scheduler=False)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"max_grad_norm": 1.0}, "max_grad_norm"),
        ({"max_steps": 4}, "max_steps"),
        ({"per_device_train_batch_size": 8}, "train_batch_size"),
        ({"bf16": True}, "bf16"),
    ],
)
def test_arguments_that_are_not_the_job_are_refused(
    tmp_path: Path, args: dict[str, Any], match: str
) -> None:
    with pytest.raises(JobMismatch, match=match):
        _train(small_job(), tmp_path / "run", **args)


def test_the_trainers_own_shuffled_dataset_is_refused(tmp_path: Path) -> None:
    from dk.pol.data import load_dataset

    job = small_job()
    ds = load_dataset(job)
    samples = [
        {"input": torch.from_numpy(ds.X[i]), "labels": torch.tensor(int(ds.y[i]))}
        for i in range(64)
    ]
    with pytest.raises(JobMismatch, match="train_dataset"):
        _train(job, tmp_path / "run", dataset=samples)


def test_a_loop_with_another_loss_is_rejected_by_the_verifier(tmp_path: Path) -> None:
    """The user's model computes MSE: it records and proves (tolerant mode does not see the
    user's gradients), but no challenged interval replays."""
    job = small_job()
    _train(job, tmp_path / "run", wrapper=MSEModel)
    report = prove_and_verify(job, tmp_path / "run")
    assert report.verdict == "reject"
    assert "REPLAY_MISMATCH" in report.codes
