"""An interrupted Lightning fit or Hugging Face Trainer run resumes from its run directory's last
committed checkpoint: the finished run proves to a bundle byte-identical to an uninterrupted
run's, and verifies; a run directory of another job is refused (``dk.pol.resume``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.helpers import WORKER

from dk.errors import FormatError
from dk.pol import Recorder, build_model
from dk.pol.resume import has_partial_run
from dk.prover import prove_run

from .common import BEACON

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning"
)

CRASH_AT = 7  # optimizer steps done when training fails: checkpoints 0, 3, 6 are committed


class Interrupted(Exception):
    """The failure in the middle of training."""


def resume_job(**kw: Any) -> Any:
    """Digits MLP, tolerant on torch, SGD Nesterov, step decay (at 4 and 8), clipping: 12 steps,
    checkpoints every 3 (the lr changes between the resumed checkpoint and the end)."""
    from dk.pol import default_job

    t = {"momentum": 0.9, "nesterov": True, "schedule": "step", "step_size": 4, "gamma": 0.5}
    t.update({"clip_norm": 0.5, **kw.pop("train", {})})
    return default_job(
        mode="tolerant",
        hidden=[8],
        steps=12,
        interval=3,
        batch_size=16,
        tolerance=0.01,
        train=t,
        **kw,
    )


def _bytes(bundle: Path) -> dict[str, bytes]:
    files = sorted(p for p in bundle.rglob("*") if p.is_file())
    return {p.relative_to(bundle).as_posix(): p.read_bytes() for p in files}


def _committed(run: Path) -> int:
    return sum(1 for ln in (run / "run.log.jsonl").read_text().splitlines() if ln.endswith("}"))


def _same_bundle_and_verifies(job: Any, whole: Path, resumed: Path) -> None:
    from dk.verifier import verify_bundle

    a = prove_run(whole, job, WORKER, whole.parent / "whole-bundle")
    b = prove_run(resumed, job, WORKER, resumed.parent / "resumed-bundle")
    assert _bytes(a) == _bytes(b)
    report = verify_bundle(b, job, beacon=BEACON, samples=1000)
    assert report.ok, report.to_dict()


# -- Lightning ---------------------------------------------------------------------------------


def _lightning() -> Any:
    return pytest.importorskip("lightning")


def _fit(job: Any, run: Path, *, resume: bool = False, crash: bool = False) -> Any:
    L = _lightning()
    from dk.integrations.lightning import DkCallback

    from .test_lightning import Module

    class Crashing(Module):  # type: ignore[misc,valid-type]
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.trainer.global_step == CRASH_AT:
                raise Interrupted(f"at step {CRASH_AT}")
            return super().training_step(batch, batch_idx)  # type: ignore[no-any-return]

    module = Crashing(job) if crash else Module(job)
    cb = DkCallback(Recorder(job, run, resume=resume), model=module.net)
    trainer = L.Trainer(
        callbacks=[cb],
        max_steps=job.steps,
        max_epochs=2,  # the job is one epoch of the loader; a resume that counts wrong stops
        accumulate_grad_batches=job.train["accumulation"],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=cb.loader())
    assert trainer.global_step == job.steps
    return cb


@pytest.mark.parametrize("accumulation", [1, 2])
def test_an_interrupted_lightning_fit_resumes_to_the_same_bundle(
    tmp_path: Path, accumulation: int
) -> None:
    job = resume_job(train={"accumulation": accumulation})
    _fit(job, tmp_path / "whole")
    run = tmp_path / "run"
    with pytest.raises(Interrupted):
        _fit(job, run, crash=True)
    assert has_partial_run(run) and _committed(run) == 3
    cb = _fit(job, run, resume=True)
    assert cb.recorder.resumed_from == 6 and cb.info.complete
    _same_bundle_and_verifies(job, tmp_path / "whole", run)


def test_lightning_refuses_to_resume_another_jobs_run(tmp_path: Path) -> None:
    job = resume_job()
    with pytest.raises(Interrupted):
        _fit(job, tmp_path / "run", crash=True)
    with pytest.raises(FormatError, match="partial run of another job"):
        _fit(resume_job(seed=1), tmp_path / "run", resume=True)
    assert has_partial_run(tmp_path / "run")  # left as it was


ROOT = Path(__file__).resolve().parents[2]
# A Lightning fit in a child process that SIGKILLs itself once CRASH_AT steps are done (after a
# pause, so the commits before it reach the log, as they would in a long run).
KILLED = """
import os, signal, sys, time
import torch
torch.set_num_threads(1)
from dk.pol import load_job, recorder
from tests.integrations import test_resume as t

kill_at = int(sys.argv[3])
orig = recorder.Recorder._on_step

def on_step(self):
    orig(self)
    if self.step == kill_at:
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

recorder.Recorder._on_step = on_step
t._fit(load_job(sys.argv[1]), t.Path(sys.argv[2]))
"""


@pytest.mark.slow
def test_a_killed_lightning_fit_resumes_to_the_same_bundle(tmp_path: Path) -> None:
    """kill -9 mid-fit: what the Recorder committed before it resumes (nothing else to lose)."""
    _lightning()
    job = resume_job()
    (tmp_path / "job.toml").write_text(job.to_toml())
    _fit(job, tmp_path / "whole")
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    argv = [sys.executable, "-c", KILLED, str(tmp_path / "job.toml"), str(run), str(CRASH_AT)]
    p = subprocess.run(argv, env=env, capture_output=True, timeout=600, check=False)
    assert p.returncode == -9, p.stderr.decode()[-2000:]
    assert has_partial_run(run) and _committed(run) == 3
    cb = _fit(job, run, resume=True)
    assert cb.recorder.resumed_from == 6
    _same_bundle_and_verifies(job, tmp_path / "whole", run)


# -- Hugging Face ------------------------------------------------------------------------------


def _train(job: Any, run: Path, *, resume: bool = False, crash: bool = False) -> Any:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from dk.integrations.hf import DkTrainerCallback, JobModel

    t = job.train
    acc = int(t["accumulation"])

    class Crashing(JobModel):
        forwards = 0

        def forward(self, input: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            if self.training:
                if self.forwards == CRASH_AT * acc:
                    raise Interrupted(f"at step {CRASH_AT}")
                self.forwards += 1
            return super().forward(input, labels)

    net = build_model(job)
    opt = torch.optim.SGD(
        net.parameters(),
        lr=t["lr"],
        momentum=t["momentum"],
        nesterov=t["nesterov"],
        weight_decay=t["weight_decay"],
        foreach=False,
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=t["step_size"], gamma=t["gamma"])
    rec = Recorder(job, run, resume=resume)
    cb = DkTrainerCallback(rec, model=net)
    args = transformers.TrainingArguments(
        output_dir=str(run.parent / "hf"),
        max_steps=job.steps,
        per_device_train_batch_size=t["batch_size"] // acc,
        gradient_accumulation_steps=acc,
        max_grad_norm=0.0,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(
        model=(Crashing if crash else JobModel)(net, job),
        args=args,
        train_dataset=cb.train_dataset(),
        optimizers=(opt, sched),
        callbacks=[cb],
    )
    with rec:  # an exception stops the Recorder's writer (a TrainerCallback sees none)
        trainer.train()
    assert trainer.state.global_step == job.steps
    return cb


@pytest.mark.parametrize("accumulation", [1, 2])
def test_an_interrupted_trainer_run_resumes_to_the_same_bundle(
    tmp_path: Path, accumulation: int
) -> None:
    job = resume_job(train={"accumulation": accumulation})
    _train(job, tmp_path / "whole")
    run = tmp_path / "run"
    with pytest.raises(Interrupted):
        _train(job, run, crash=True)
    assert has_partial_run(run) and _committed(run) == 3
    cb = _train(job, run, resume=True)
    assert cb.recorder.resumed_from == 6 and cb.info.complete
    _same_bundle_and_verifies(job, tmp_path / "whole", run)


def test_the_trainer_refuses_to_resume_another_jobs_run(tmp_path: Path) -> None:
    job = resume_job()
    with pytest.raises(Interrupted):
        _train(job, tmp_path / "run", crash=True)
    with pytest.raises(FormatError, match="partial run of another job"):
        _train(resume_job(seed=1), tmp_path / "run", resume=True)
