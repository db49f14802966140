"""A Lightning ``Callback`` that records a PoL transcript with :class:`dk.pol.Recorder`.

>>> rec = Recorder(job, "run/")                                  # doctest: +SKIP
>>> cb = DkCallback(rec, model=net)        # net: build_model(job), held by the LightningModule
>>> trainer = L.Trainer(max_steps=job.steps, callbacks=[cb])    # doctest: +SKIP
>>> trainer.fit(module, train_dataloaders=cb.loader())          # doctest: +SKIP

``on_fit_start`` attaches the Recorder to the model, to the optimizer and scheduler that
``configure_optimizers`` returned, and replaces the Trainer's optimizer by the recorded one, so
every optimizer step is the Recorder's step (its checks of learning rate, forward passes,
clipping, finiteness; SPEC §12.4). ``on_train_end`` finishes the run (``run.json``).

Data: train on :meth:`DkCallback.loader` (pass it to ``fit`` or return it from
``train_dataloader``): the job's (micro-)batches, with the job's augmentation, in the job's
order. It is sized, so Lightning fetches no batch ahead.

Closures (decided here): Lightning's automatic optimization calls ``optimizer.step(closure)``
with the forward and backward inside the closure. The recorded optimizer checks the step's
forward passes and clips before it steps, so the Trainer gets a thin wrapper that evaluates the
closure first, under ``torch.enable_grad()``, and then takes the recorded step without it: the
order ``torch.optim.SGD/Adam/AdamW`` use for a closure themselves (one evaluation, then the
update). Manual optimization works too (its ``opt.step()`` reaches the same wrapper).

Resuming (SPEC §8, ``dk.pol.resume``): give the callback ``Recorder(job, run_dir,
resume=True)`` and fit a fresh Trainer and module as before. When ``run_dir`` holds an
interrupted run of the job, the Recorder restores the model, the optimizer state and the
scheduler from its last committed checkpoint (a run of another job is refused, ``FormatError``),
the loader continues the job's batch order from that step, and the Trainer's ``global_step``
starts there (``max_steps`` stays ``job.steps``): the finished run, and so its bundle, is byte
for byte the uninterrupted one's. An exception during ``fit`` stops the Recorder
(``on_exception``); what it committed stays resumable.

What the Trainer must say as the job does, else :class:`dk.errors.JobMismatch` at fit start:
``max_steps = job.steps``, ``accumulate_grad_batches = train.accumulation``, no
``gradient_clip_val`` (the job's clipping is the Recorder's), ``precision`` ``"32-true"`` for
fp32 jobs or ``"bf16-mixed"`` for bf16 (or run the forward inside ``rec.autocast()``); one
optimizer, and at most one scheduler stepped every step (``"interval": "step"``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from dk.errors import BackendUnavailable, JobMismatch

try:
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - the older distribution name
    try:
        from pytorch_lightning import Callback  # type: ignore[no-redef,assignment]
    except ImportError as e:
        msg = "Lightning is not installed: pip install 'dk-pol[lightning]'"
        raise BackendUnavailable(msg) from e

__all__ = ["DkCallback"]

# Trainer precisions per job precision: "32-true" runs the forward as the user writes it (a
# bf16/fp16 job then autocasts in ``rec.autocast()``); "16-mixed" scales the loss: refused.
_PRECISION = {"fp32": ("32-true", "32"), "bf16": ("bf16-mixed", "32-true", "32")}
_PRECISION["fp16"] = _PRECISION["fp32"]


def _start_at(trainer: Any, step: int) -> None:
    """Make the Trainer count optimizer steps from ``step`` (a resumed run's first step).

    Lightning's ``global_step`` is its optimizer-step progress counter (the automatic or the
    manual loop's); a fit from a Lightning checkpoint restores it the same way.
    """
    loop = trainer.fit_loop.epoch_loop
    for prog in (
        loop.automatic_optimization.optim_progress.optimizer.step,
        loop.manual_optimization.optim_step_progress,
    ):
        prog.total.ready = prog.total.completed = step
    loop._batches_that_stepped = step  # what loggers take as the step
    if trainer.global_step != step:
        raise JobMismatch(
            f"cannot resume at step {step}: this Lightning keeps its step count elsewhere"
        )


class _ClosureFirst(torch.optim.Optimizer):
    """The recorded optimizer, taking Lightning's closure: evaluate it, then step without it."""

    def __init__(self, recorded: torch.optim.Optimizer) -> None:
        # Not Optimizer.__init__: groups and state are the recorded (the user's) own objects.
        self._recorded = recorded
        self.defaults, self.param_groups, self.state = (
            recorded.defaults,
            recorded.param_groups,
            recorded.state,
        )

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """Run ``closure`` (forward and backward), then the recorded step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._recorded.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The recorded optimizer's ``zero_grad``."""
        self._recorded.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The recorded optimizer's state dict (Lightning's checkpoints)."""
        return self._recorded.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refused by the recorded optimizer: the state is the job's."""
        self._recorded.load_state_dict(state_dict)


class _Batches:
    """The job's (micro-)batches for ``fit``: the attached Recorder's loader, sized."""

    def __init__(self, cb: DkCallback) -> None:
        self._cb = cb

    def __len__(self) -> int:  # micro-batches left (the Recorder's loader counts steps)
        rec = self._cb.recorder
        return (rec.job.steps - rec.step) * int(rec.job.train.get("accumulation", 1))

    def __iter__(self) -> Iterator[Any]:
        if self._cb._loader is None:
            raise JobMismatch("DkCallback.loader() is iterated before fit starts")
        return iter(self._cb._loader)


class DkCallback(Callback):  # type: ignore[misc]
    """Records a Lightning ``fit`` with ``recorder`` (see the module docs).

    Args:
        recorder: a fresh :class:`dk.pol.Recorder` for the job (``resume=True`` continues an
            interrupted run in its directory; see the module docs).
        model: the job's model inside the LightningModule (``build_model(job)``); ``None``
            means the LightningModule itself is the job's model.
    """

    def __init__(self, recorder: Any, *, model: torch.nn.Module | None = None) -> None:
        self.recorder, self.model = recorder, model
        self.info: Any = None  # the RunInfo, once the run is finished
        self._loader: Any = None
        self._ended = False

    def loader(self) -> _Batches:
        """The job's batches in the job's order, for ``fit(train_dataloaders=...)``."""
        return _Batches(self)

    def _check_trainer(self, trainer: Any) -> None:
        job = self.recorder.job
        acc = int(job.train.get("accumulation", 1))
        prec = str(job.train.get("precision", "fp32"))
        got = {
            "max_steps": trainer.max_steps,
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "gradient_clip_val": trainer.gradient_clip_val or None,
            "world_size": trainer.world_size,  # a data-parallel job is dk.dist's, not this
        }
        want_of = {"max_steps": job.steps, "accumulate_grad_batches": acc, "world_size": 1}
        for k, want in want_of.items():
            if got[k] != want:
                raise JobMismatch(f"Trainer({k}={got[k]!r}): the job says {want!r}")
        if got["gradient_clip_val"] is not None:
            raise JobMismatch("Trainer(gradient_clip_val=...): dk clips as the job says; drop it")
        if str(trainer.precision) not in _PRECISION.get(prec, ()):
            raise JobMismatch(f"Trainer(precision={trainer.precision!r}): the job trains in {prec}")
        if len(trainer.optimizers) != 1 or len(trainer.lr_scheduler_configs) > 1:
            raise JobMismatch(
                "configure_optimizers must return one optimizer, at most one scheduler"
            )
        for c in trainer.lr_scheduler_configs:
            if (c.interval, c.frequency) != ("step", 1):
                raise JobMismatch('the scheduler must step every step: {"interval": "step"}')

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Check the Trainer, attach the Recorder, swap in the recorded optimizer."""
        self._check_trainer(trainer)
        configs = trainer.lr_scheduler_configs
        _, recorded, self._loader = self.recorder.attach(
            model=self.model if self.model is not None else pl_module,
            optimizer=trainer.optimizers[0],
            scheduler=configs[0].scheduler if configs else None,
        )
        trainer.strategy.optimizers = [_ClosureFirst(recorded)]
        if self.recorder.resumed_from:
            _start_at(trainer, int(self.recorder.step))

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """Finish a run that had no step left (resumed after its last checkpoint)."""
        if not self._ended and self._loader is not None:
            self.on_train_end(trainer, pl_module)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Finish the run: wait for the commits, write ``run.json``."""
        self._ended = True
        self.info = self.recorder.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Abort the run (no ``run.json``: ``dk prove`` refuses it)."""
        if not self._ended and self._loader is not None:
            self.recorder.__exit__(type(exception), exception, None)
