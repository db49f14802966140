"""``dk train``: train a job's model with recording (the worker's default loop)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dk.pol.data import load_dataset
from dk.pol.job import JobSpec, as_job
from dk.pol.models import build_model
from dk.pol.modelsrc import model_code_errors
from dk.pol.recorder import Recorder
from dk.pol.run import RunInfo


def train_job(
    job: JobSpec | str | Path,
    run_dir: str | Path,
    *,
    progress: Any = None,
    engine: Any = None,
    resume: bool = False,
) -> RunInfo:
    """Train ``job`` from its initial weights, writing a run directory to ``run_dir``.

    Args:
        job: the job (or a path to ``job.toml``).
        run_dir: output directory (created).
        progress: optional ``callable(step)`` called after a step at most every 0.1 s, and
            after the last step.
        engine: a step engine that computes whole steps (see :class:`Recorder`); default:
            dk's kernels in exact mode, else PyTorch.
        resume: continue the interrupted run in ``run_dir`` from its last committed
            checkpoint, if it holds one (:mod:`dk.pol.resume`); else start at step 0.

    Returns:
        The run's summary (also written as ``run_dir/run.json``).
    """
    job = as_job(job)
    dataset = load_dataset(job)
    rec = Recorder(job, run_dir, dataset=dataset, progress=progress, engine=engine, resume=resume)
    with rec:  # an exception aborts the recording (committed checkpoints stay; dispatch off)
        _train(job, rec, dataset)
    return rec.info


def _train(job: JobSpec, rec: Recorder, dataset: Any) -> None:
    """Every step of ``job`` under ``rec`` (which :func:`train_job` finishes)."""
    if rec.engine is not None:  # exact (dk kernels) or zk: the engine computes every step
        rec.start_engine()
        for _ in range(rec.step, job.steps):
            rec.engine_step()
        return
    from dk.pol.schedule import make_scheduler  # torch computes the steps
    from dk.pol.torch_adapter import make_loss, make_optimizer, resolve_device

    device = resolve_device(job)  # a CUDA job on a machine without CUDA stops here
    model = build_model(job)
    if job.is_custom:  # a consumer's model: one clear line if it does not fit the data
        from dk.pol.probe import check_model_fits

        check_model_fits(job, model, dataset)
    model = model.to(device)
    model.train()
    optimizer = make_optimizer(job, model.parameters())
    scheduler = make_scheduler(job, optimizer)
    loss_fn = make_loss(job, getattr(dataset, "output_dim", None))
    acc = int(job.train["accumulation"])
    model, optimizer, loader = rec.attach(model=model, optimizer=optimizer, scheduler=scheduler)
    with model_code_errors(lambda: rec.step):  # the model's own exception: exit 3, one line
        for i, (x, y) in enumerate(loader):  # SPEC §12.4: the replay's step
            if i % acc == 0:
                optimizer.zero_grad(set_to_none=True)
            with rec.autocast():
                out = model(x.to(device))
            (loss_fn(out, y.to(device)) / acc).backward()
            if i % acc == acc - 1:
                optimizer.step()
                scheduler.step()
