"""A Hugging Face ``TrainerCallback`` that records a PoL transcript with :class:`dk.pol.Recorder`.

>>> rec = Recorder(job, "run/")                                  # doctest: +SKIP
>>> net = build_model(job)                                       # doctest: +SKIP
>>> cb = DkTrainerCallback(rec, model=net)                       # doctest: +SKIP
>>> Trainer(model=JobModel(net, job), args=args, train_dataset=cb.train_dataset(),
...         optimizers=(opt, sched), callbacks=[cb]).train()     # doctest: +SKIP

``on_train_begin`` attaches the Recorder to the job's model and to the Trainer's optimizer and
scheduler, and puts the recorded optimizer inside accelerate's optimizer wrapper, so every
optimizer step the Trainer takes is the Recorder's step (SPEC §12.4). ``on_train_end`` finishes
the run (``run.json``).

Data: the Trainer's own sampler shuffles a map-style dataset and accelerate fetches one batch
ahead, so :meth:`DkTrainerCallback.train_dataset` is an ``IterableDataset`` (no sampler) of the
job's (augmented) micro-batches in the job's order, one ``{"input", "labels"}`` sample at a
time; the Trainer's batch size re-forms the micro-batches. It is a pure function of the step,
so fetching ahead is harmless; the callback advances the Recorder's own loader at each
``on_step_begin`` so that the Recorder scores the step's forward passes against the step's
targets (SPEC §11.7). That computes each batch twice (a cost for a later Recorder hook to remove).

Resuming (SPEC §8, ``dk.pol.resume``): give the callback ``Recorder(job, run_dir,
resume=True)`` and train a fresh Trainer as before (not ``resume_from_checkpoint``: the run
directory is the checkpoint). When ``run_dir`` holds an interrupted run of the job, the Recorder
restores the model, the optimizer state and the scheduler from its last committed checkpoint
(a run of another job is refused, ``FormatError``), :meth:`DkTrainerCallback.train_dataset`
continues the job's batch order from that step, and the Trainer's ``state.global_step`` starts
there (``max_steps`` stays ``job.steps``): the finished run, and so its bundle, is byte for
byte the uninterrupted one's. A ``TrainerCallback`` sees no exception: run ``trainer.train()``
inside ``with recorder:`` so that one stops the Recorder's writer after what it committed.

``TrainingArguments`` must say what the job says, else :class:`dk.errors.JobMismatch` at train
start: ``max_steps = job.steps``, ``gradient_accumulation_steps = train.accumulation``,
``per_device_train_batch_size`` = the micro-batch, ``max_grad_norm = 0`` (dk clips as the job
says), ``bf16`` only for a bf16 job, never ``fp16`` (loss scaling); pass the job's optimizer
and a scheduler computing the job's schedule in ``optimizers=(opt, sched)``, or
``lr_scheduler_type="constant"`` for a constant job (the Trainer's default ``linear`` decays).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from dk.errors import BackendUnavailable, JobMismatch

try:
    from transformers import TrainerCallback
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise BackendUnavailable("transformers is not installed: pip install 'dk-pol[hf]'") from e

__all__ = ["DkTrainerCallback", "JobBatches", "JobModel"]


class JobModel(torch.nn.Module):
    """The job's model for ``Trainer``: ``forward(input, labels)`` returns the job's loss."""

    def __init__(self, model: torch.nn.Module, job: Any) -> None:
        super().__init__()
        from dk.pol.torch_adapter import make_loss

        self.model, self._loss = model, make_loss(job)

    def forward(self, input: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """The logits and the job's loss (SPEC §6.1)."""
        logits = self.model(input)
        return {"loss": self._loss(logits, labels), "logits": logits}


class JobBatches(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """The job's micro-batches from the Recorder's current step on, one sample at a time."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        from dk.pol.torch_adapter import job_batch

        rec = self.recorder
        for t in range(rec.step, rec.job.steps):
            x, y = job_batch(rec.job, rec.dataset, rec.sampler, t)
            for i in range(len(y)):
                yield {"input": x[i], "labels": y[i]}


class DkTrainerCallback(TrainerCallback):  # type: ignore[misc]
    """Records a ``transformers.Trainer`` run with ``recorder`` (see the module docs).

    Args:
        recorder: a fresh :class:`dk.pol.Recorder` for the job (``resume=True`` continues an
            interrupted run in its directory; see the module docs).
        model: the job's model (``build_model(job)``) inside the Trainer's model.
    """

    def __init__(self, recorder: Any, *, model: torch.nn.Module) -> None:
        self.recorder, self.model = recorder, model
        self.info: Any = None  # the RunInfo, once the run is finished
        self._batches: Iterator[Any] | None = None

    def train_dataset(self) -> JobBatches:
        """The job's samples in the job's order, for ``Trainer(train_dataset=...)``."""
        return JobBatches(self.recorder)

    def _check_args(self, args: Any, loader: Any) -> None:
        t = self.recorder.job.train
        acc, prec = int(t.get("accumulation", 1)), str(t.get("precision", "fp32"))
        want = {
            "max_steps": self.recorder.job.steps,
            "gradient_accumulation_steps": acc,
            "train_batch_size": int(t["batch_size"]) // acc,
            "world_size": 1,
        }
        for k, v in want.items():
            if getattr(args, k) != v:
                raise JobMismatch(f"TrainingArguments {k}={getattr(args, k)!r}: the job says {v!r}")
        if args.max_grad_norm:
            raise JobMismatch("TrainingArguments max_grad_norm must be 0: dk clips as the job says")
        if args.fp16 or (args.bf16 and prec != "bf16"):
            raise JobMismatch(f"TrainingArguments bf16/fp16: the job trains in {prec}")
        base = getattr(loader, "base_dataloader", loader)
        if not isinstance(getattr(base, "dataset", None), JobBatches):
            raise JobMismatch("train on DkTrainerCallback.train_dataset() (the job's order)")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        """Check the arguments, attach the Recorder, record the Trainer's optimizer."""
        self._check_args(args, kw.get("train_dataloader"))
        opt: Any = kw["optimizer"]
        if not hasattr(opt, "optimizer"):
            raise JobMismatch("the Trainer's optimizer is not accelerate's wrapper")
        wrapped = kw.get("lr_scheduler")
        sched: Any = getattr(wrapped, "scheduler", wrapped)  # accelerate's wrapper, or the user's
        inner = opt.optimizer
        if getattr(sched, "optimizer", None) is opt:
            sched.optimizer = inner  # the Trainer's own scheduler: the same groups, unwrapped
        _, recorded, loader = self.recorder.attach(
            model=self.model, optimizer=inner, scheduler=sched
        )
        opt.optimizer = recorded
        self._batches = iter(loader)
        if self.recorder.resumed_from:  # count the Trainer's steps from the resumed step
            state.global_step = int(self.recorder.step)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        """The Recorder's loader steps to this step (its targets score the forward passes)."""
        assert self._batches is not None
        for _ in range(int(self.recorder.job.train.get("accumulation", 1))):
            next(self._batches)

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        """Finish the run: wait for the commits, write ``run.json``."""
        self.info = self.recorder.finish()
