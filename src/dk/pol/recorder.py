"""Record a PoL transcript from a user's own PyTorch loop (opacus-style ``attach``).

>>> rec = Recorder(job, "run/")                                     # doctest: +SKIP
>>> model, optimizer, loader = rec.attach(model=build_model(job),   # doctest: +SKIP
...     optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
>>> for x, y in loader:                                             # doctest: +SKIP
...     optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
>>> info = rec.finish()                                             # doctest: +SKIP

``attach`` checks that the model, optimizer and loader are the job's, and returns the model,
the optimizer wrapped so that each ``step()`` is counted, and a loader that yields the job's
batches in the job's order. Every ``k`` steps a snapshot is taken; snapshots are hashed and
written in batches (:mod:`dk.pol.writer`), large ones on a background thread so training is
not held up, small ones by the training thread (a thread would cost it more); blobs are not
fsynced one by one, the run is made durable once, before ``run.json`` marks it complete.

torch is imported only when torch computes the steps (or when ``attach`` is given torch
objects): a run on a step engine (dk kernels, zk circuit) never loads it.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from dk.crypto.hashing import digests_equal
from dk.crypto.numeric import fold_sum_inplace
from dk.errors import FormatError, JobMismatch, TrainingDiverged
from dk.pol.checkpoint import Tensors, sync_files
from dk.pol.data import Dataset, check_dims, load_dataset
from dk.pol.job import JobSpec, as_job
from dk.pol.loss import LOSS_KEY, LossMeter, loss_required
from dk.pol.models import initial_state, state_specs
from dk.pol.run import RunInfo, write_run
from dk.pol.sampler import job_sampler
from dk.pol.writer import CommitWriter

if TYPE_CHECKING:
    import torch
else:

    class _LazyTorch:
        """``torch`` imported on first use: a run on dk's kernels never imports it."""

        def __getattr__(self, name: str) -> Any:
            import torch

            return getattr(torch, name)

    torch = _LazyTorch()

__all__ = ["JobMismatch", "Recorder", "TrainingDiverged"]

LR_RTOL = 1e-6  # a user's scheduler may round differently; dk then sets its own value
GRAD_RTOL = 1e-3  # user's vs kernel gradients (float32 torch vs fixed-order kernels)
SEED_BLOCK = 64  # step seeds derived together, in one warm loop, ahead of the steps
SCHEDULE_DRY_RUN = 100_000  # steps of a user's scheduler checked at attach
PROGRESS_PERIOD_S = 0.1  # a progress bar redraws per call: not once per (fast) step


def _lr_close(got: float, want: float) -> bool:
    return abs(got - want) <= LR_RTOL * abs(want) + 1e-15


def check_data(job: JobSpec, dataset: Dataset) -> None:
    """Raise unless the dataset's commitment equals the job's ``data.root``."""
    want = job.data.get("root", "")
    if want and not digests_equal(dataset.root(), bytes.fromhex(want)):
        raise FormatError("the dataset does not match the job's data.root", reason="DATA_MISMATCH")


@functools.cache
def _recorded_optimizer_type() -> type:
    """The recorded-optimizer class, built on first use (torch is imported only then)."""
    import torch

    class _RecordedOptimizer(torch.optim.Optimizer):
        """The user's optimizer, recorded: a real ``torch.optim.Optimizer`` sharing its groups and
        state, so LR schedulers built on either object drive the same learning rate.

        Each ``step()`` checks the learning rate against the job's schedule (then sets dk's exact
        value), checks the step's forward passes, clips by global norm when the job says so, runs
        the user's optimizer (or the step engine), and stops at the first non-finite update.
        """

        def __init__(self, inner: torch.optim.Optimizer, recorder: Recorder) -> None:
            # Not Optimizer.__init__: the groups and state are the inner optimizer's own objects.
            self._inner, self._recorder = inner, recorder
            self.defaults = inner.defaults
            self.param_groups = inner.param_groups
            self.state = inner.state

        def step(self, closure: Any = None) -> Any:
            """One recorded training step (see the class docs)."""
            rec = self._recorder
            rec._check_step_inputs(self)
            if rec.engine is not None:  # a step engine (dk kernels, zk circuit) does the whole step
                rec._kernel_step()
                rec._on_step()
                return None
            if rec.dp is None and rec._model is not None:  # DP-SGD computes its own gradients
                rec._require_gradients()
            if rec.codec is not None and rec._model is not None:  # compressed job: SPEC Part III
                rec.codec.compress_grads_(rec._model.named_parameters())
            if rec.dp is not None and rec._model is not None:  # DP-SGD: SPEC Part VII §4
                rec.dp_grads_()
            if rec._model is not None:
                rec._clip_gradients()
            out = self._inner.step(closure)
            with rec._pause():  # the Recorder's own work is not part of the step's log
                rec._check_finite()
                rec._on_step()
            return out

        def zero_grad(self, set_to_none: bool = True) -> None:
            """The user's optimizer's ``zero_grad``."""
            self._inner.zero_grad(set_to_none=set_to_none)

        def state_dict(self) -> dict[str, Any]:
            """The user's optimizer's state dict."""
            return self._inner.state_dict()

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            """Refused: the optimizer state comes from the job's checkpoints."""
            raise JobMismatch("load_state_dict on a recorded optimizer: the state is the job's")

        def __getattr__(self, name: str) -> Any:
            if name.startswith("_inner"):
                raise AttributeError(name)
            return getattr(self._inner, name)

        def __repr__(self) -> str:
            return f"Recorded({self._inner!r})"

    return _RecordedOptimizer


def _flat_views(rec: Any) -> list[torch.Tensor] | None:
    """1-d views of ``rec._params`` (``None`` unless they share one dtype and device), kept in
    ``rec._flat_cache`` and remade only when a parameter's storage moved."""
    params = rec._params
    ptrs = [p.data_ptr() for p in params]
    cache = getattr(rec, "_flat_cache", None)
    if cache is None or cache[0] != ptrs:
        first = params[0]
        same = all(p.dtype == first.dtype and p.device == first.device for p in params)
        views = [p.detach().reshape(-1) for p in params] if same else None
        if views is not None and any(v.data_ptr() != q for v, q in zip(views, ptrs, strict=True)):
            views = None  # a non-contiguous weight: reshape copied it
        cache = rec._flat_cache = (ptrs, views)
    return cast("list[torch.Tensor] | None", cache[1])


class JobLoader:
    """Yields ``(x, y)`` torch batches of the job, one per remaining step."""

    def __init__(self, recorder: Recorder) -> None:
        self._rec = recorder

    def __len__(self) -> int:
        return self._rec.job.steps - self._rec.step

    def __iter__(self) -> Any:
        from dk.pol.torch_adapter import job_batch

        rec = self._rec
        acc = int(rec.job.train.get("accumulation", 1))
        for t in range(rec.step, rec.job.steps):
            if rec.step != t:
                raise JobMismatch(
                    "optimizer.step() must be called exactly once per batch "
                    f"(step {rec.step}, batch {t})"
                )
            x, y = job_batch(rec.job, rec.dataset, rec.sampler, t)
            if acc == 1:
                rec._ys = [y]  # the targets the loss hook scores the forward pass against
                yield x, y
            else:  # the job's micro-batches, one forward pass each, then one optimizer.step()
                rec._ys = list(y.chunk(acc))
                yield from zip(x.chunk(acc), rec._ys, strict=True)


class Recorder:
    """Wraps a training loop and writes a run directory (see module docs)."""

    def __init__(
        self,
        job: JobSpec | str | Path,
        run_dir: str | Path,
        *,
        dataset: Dataset | None = None,
        progress: Any = None,
        engine: Any = None,
        resume: bool = False,
    ) -> None:
        self.job = as_job(job)
        self.run_dir = Path(run_dir)
        self.rounding: Any = None  # pol.backend = "rounded": one rounding log per interval
        if self.job.pol.get("backend") == "rounded":
            from dk.pol.backends.recording import RoundingRecorder

            self.rounding = RoundingRecorder(self.job, self.run_dir)
        self.dataset = dataset if dataset is not None else load_dataset(self.job)
        check_data(self.job, self.dataset)
        check_dims(self.job, self.dataset)
        self.sampler = job_sampler(self.job, len(self.dataset))
        self.step = 0
        self._steps = self.job.steps  # read once per step: not through the job's properties
        self.progress = progress
        self._ckpt_steps = self.job.checkpoint_steps()
        self._next = 1
        self._forwards = 0
        self._clip_warned = False  # _warn_if_clipped_twice: once per Recorder
        self._model: torch.nn.Module | None = None
        self._hidden: dict[str, Any] | None = None  # hidden_state when the model was attached
        self._pausing = False  # inside paused(): forwards are not the step's
        self._opt: torch.optim.Optimizer | None = None
        self._writer: CommitWriter | None = None
        self._progress_at = 0.0
        # SPEC §11.7: the per-interval training loss, committed in each interval's ext.
        self._loss: LossMeter | None = (
            LossMeter(int(self.job.train.get("accumulation", 1)))
            if loss_required(self.job)
            else None
        )
        self._ys: list[Any] | None = None
        self.dp: dict[str, Any] | None = self.job.train.get("dp")
        self.dp_epsilon: float | None = None
        self._in_dp = False
        if self.dp is not None:  # refuse a budget the job does not allow, before training
            from dk.pol.dp import check_budget

            self.dp_epsilon = check_budget(self.job, len(self.dataset))
        self.codec: Any = None
        if self.job.train.get("compression"):
            from dk.pol.torch_adapter import make_codec

            self.codec = make_codec(self.job)
        from dk.pol.kernel_adapter import KernelSession, uses_kernels

        # A step engine owns the NumPy state and computes whole steps: dk's reproducible
        # kernels in exact mode, or a caller's engine (the zk circuit session). It has
        # ``params``, ``step(x, y)`` and ``snapshot(step, steps_per_epoch)``.
        if engine is None and uses_kernels(self.job):
            engine = KernelSession(self.job)
        self.engine = engine
        # torch computes the steps only without an engine; then exact/zk pin it to one thread
        # with deterministic algorithms (pinning it otherwise would also cap the kernels'
        # OpenMP pool, which torch shares).
        self._det: Any = contextlib.nullcontext()
        if engine is None:
            from dk.pol.torch_adapter import deterministic

            pin = self.job.mode in ("exact", "zk") and self.rounding is None  # SPEC VI: any count
            self._det = deterministic(1 if pin else None)
        self.info = RunInfo(
            job_id=self.job.job_id.hex(),
            data_root=self.dataset.root().hex(),
            interval=self.job.interval,
            steps=self.job.steps,
        )
        # resume=True: continue the interrupted run in run_dir, if there is one (dk.pol.resume)
        self._partial: Any = None
        self._prev_ck: Tensors | None = None
        self._scheduler: Any = None
        if resume:
            from dk.pol.resume import has_partial_run, read_partial_run

            if has_partial_run(self.run_dir):
                self._partial = read_partial_run(
                    self.run_dir, self.job, self.sampler.steps_per_epoch
                )
                if self.rounding is not None:  # refused before anything is rewritten
                    self.rounding.check_partial(self._partial)

    @property
    def resumed_from(self) -> int | None:
        """The step this run resumed from (``None`` for a run started from step 0)."""
        return None if self._partial is None else int(self._partial.step)

    @property
    def device(self) -> torch.device:
        """The job's device (``train.device``), where the user's model belongs before
        :meth:`attach`: ``build_model(job).to(rec.device)``.

        Raises:
            BackendUnavailable: a CUDA job on a machine where torch sees no CUDA device (exit 4).
        """
        from dk.pol.torch_adapter import resolve_device

        return resolve_device(self.job)

    # -- attach ------------------------------------------------------------------------
    def _check_model(self, model: torch.nn.Module) -> None:
        job = self.job
        got = {n: (tuple(v.shape), str(v.dtype)[6:]) for n, v in model.state_dict().items()}
        want = {n: (s, d) for n, s, d in state_specs(job)}
        if got != want:
            what = "model file's" if job.is_custom else f"{job.model['arch']}"
            missing = sorted(set(want) - set(got))[:3]
            extra = sorted(set(got) - set(want))[:3]
            diff = [n for n in want if n in got and got[n] != want[n]][:3]
            raise JobMismatch(
                f"the model's parameters and buffers are not the job's {what} model: "
                f"missing {missing}, extra {extra}, "
                f"shape/dtype differs {diff}"
            )
        want_dev = self.device  # a CUDA job without CUDA: BackendUnavailable, not "move it"
        dev = next(iter(model.state_dict().values())).device
        if dev.type != want_dev.type:
            raise JobMismatch(
                f"the model is on {dev.type}, the job trains on {want_dev.type} "
                "(move it with model.to(rec.device) before attach)"
            )
        state = model.state_dict()
        for name, value in initial_state(job).items():
            if not np.array_equal(state[name].detach().cpu().numpy(), value):
                raise JobMismatch(
                    f"model tensor {name} is not the job's initial weight "
                    "(use dk.pol.build_model(job))"
                )

    def _check_optimizer(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, scheduled: bool
    ) -> None:
        import torch

        from dk.pol.schedule import lr_at

        t = self.job.train
        cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[
            t["optimizer"]
        ]
        if type(optimizer) is not cls:
            raise JobMismatch(f"optimizer must be torch.optim.{cls.__name__} for this job")
        if len(optimizer.param_groups) != 1:
            raise JobMismatch("optimizer must have exactly one parameter group")
        g = optimizer.param_groups[0]
        if [id(p) for p in g["params"]] != [id(p) for p in model.parameters()]:
            raise JobMismatch("optimizer must hold the model's parameters in model order")
        want: dict[str, Any] = {"weight_decay": t["weight_decay"], "maximize": False}
        if t["optimizer"] == "sgd":
            want.update(momentum=t["momentum"], dampening=0, nesterov=t["nesterov"])
        else:
            want.update(betas=tuple(t["betas"]), eps=t["eps"], amsgrad=False)
        for k, v in want.items():
            got = tuple(g[k]) if isinstance(g.get(k), list | tuple) else g.get(k)
            if got != v:
                raise JobMismatch(f"optimizer {k}={got!r}, the job says {v!r}")
        if not scheduled and not _lr_close(g["lr"], lr_at(self.job, 0)):
            raise JobMismatch(f"optimizer lr={g['lr']!r}, the job says {lr_at(self.job, 0)!r}")
        # Options that change the update rule (absent in older torch releases: default False).
        for k in ("capturable", "differentiable") + (
            ("decoupled_weight_decay",) if t["optimizer"] == "adam" else ()
        ):
            if g.get(k, False):
                raise JobMismatch(f"optimizer {k}=True is not the job's update rule (the replay's)")
        if self.job.mode != "tolerant" and (g.get("foreach") or g.get("fused")):
            raise JobMismatch("use foreach=False and fused=False (the replay's implementation)")
        if optimizer.state:
            raise JobMismatch("optimizer already has state; attach before the first step")

    def _check_scheduler(self, scheduler: Any, optimizer: torch.optim.Optimizer) -> None:
        """Dry-run a user's LR scheduler against the job's schedule, then rewind it."""
        import warnings

        from dk.pol.schedule import lr_at

        kind = self.job.train["schedule"]
        if scheduler is None:
            if kind != "constant" or self.job.train["warmup_steps"]:
                raise JobMismatch(
                    f"this job's learning rate follows a {kind} schedule; pass scheduler= "
                    "(dk.pol.make_scheduler(job, optimizer) or your own that computes the same)"
                )
            return
        if getattr(scheduler, "optimizer", None) is not optimizer:
            raise JobMismatch("scheduler= must drive the optimizer passed to attach")
        saved = scheduler.state_dict()
        lrs = [g["lr"] for g in optimizer.param_groups]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for t in range(min(self.job.steps, SCHEDULE_DRY_RUN)):
                    got, want = optimizer.param_groups[0]["lr"], lr_at(self.job, t)
                    if not _lr_close(got, want):
                        raise JobMismatch(
                            f"the scheduler gives lr {got:.6g} at step {t}; the job's {kind} "
                            f"schedule says {want:.6g}"
                        )
                    scheduler.step()
        finally:
            scheduler.load_state_dict(saved)
            for g, lr in zip(optimizer.param_groups, lrs, strict=True):
                g["lr"] = lr

    def attach(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        data: Any = None,
        loader: Any = None,
    ) -> tuple[torch.nn.Module, Any, JobLoader]:
        """Check the user's objects against the job and start recording.

        Args:
            model: the job's model (``dk.pol.build_model(job)``, moved to the job's device).
            optimizer: the job's optimizer over ``model.parameters()``.
            scheduler: a torch LR scheduler over ``optimizer`` computing the job's schedule
                (required when the job has one); checked step by step now.
            data: the job's dataset, when the Recorder was not given it (checked by root).
            loader: the user's own loader, checked for batch size and length, then replaced.

        Returns:
            ``(model, optimizer, loader)``: the model, the optimizer recorded (a real
            ``torch.optim.Optimizer``), and a loader of the job's (micro-)batches.

        Raises:
            JobMismatch: with a message saying which object differs from the job and how.
        """
        if data is not None:
            self._use_data(data)
        self._check_model(model)
        self._check_optimizer(optimizer, model, scheduled=scheduler is not None)
        self._check_scheduler(scheduler, optimizer)
        self._scheduler = scheduler
        if loader is not None:
            bs = getattr(loader, "batch_size", None)
            ds = getattr(loader, "dataset", None)
            mb = self.job.train["batch_size"] // self.job.train["accumulation"]
            if bs is not None and bs not in (self.job.train["batch_size"], mb):
                raise JobMismatch(
                    f"loader batch_size {bs}, the job says {self.job.train['batch_size']}"
                )
            if ds is not None and hasattr(ds, "__len__") and len(ds) != len(self.dataset):
                raise JobMismatch(
                    f"loader dataset has {len(ds)} samples, the job's has {len(self.dataset)}"
                )
        self._model, self._opt = model, optimizer
        from dk.pol.torch_adapter import hidden_state  # imports torch: only here

        self._hidden = hidden_state(model)  # what no checkpoint holds, before any step
        # Walked once: model.parameters() costs a module-tree walk per call, twice a step.
        self._params = [p for _, p in model.named_parameters()]
        self._param_names = [n for n, _ in model.named_parameters()]
        # Read once: the forward hooks run twice a step (job.train is a dict lookup each).
        self._seed = self.job.seed
        self._seeds: tuple[int, int, list[int]] = (0, 0, [])
        from dk.pol.augment import apply_seed, step_seed  # imports torch: only here

        self._apply_seed, self._derive_seed = apply_seed, step_seed
        self._dev_type = str(self.job.train.get("device", "cpu"))
        self._precision = str(self.job.train.get("precision", "fp32"))
        self._autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self._precision)
        self._hook = model.register_forward_pre_hook(self._on_forward)
        if self.job.train.get("precision", "fp32") != "fp32":
            self._post_hook = model.register_forward_hook(self._after_forward)
        if self._loss is not None and self.engine is None:  # an engine reports its own loss
            from dk.pol.torch_adapter import make_loss

            self._loss_fn = make_loss(self.job, getattr(self.dataset, "output_dim", None))
            self._loss_hook = model.register_forward_hook(self._record_loss)
        self._start()
        return model, _recorded_optimizer_type()(optimizer, self), JobLoader(self)

    def _use_data(self, data: Any) -> None:
        if not hasattr(data, "root"):
            from dk.pol import data as data_mod

            adapt = getattr(data_mod, "from_map_style", None)
            if adapt is None:
                raise JobMismatch("data= must be a dk dataset (dk.pol.data)")
            data = adapt(data)
        check_data(self.job, data)
        check_dims(self.job, data)
        self.dataset = data
        self.sampler = job_sampler(self.job, len(data))
        self.info.data_root = data.root().hex()

    # -- the user's loop -----------------------------------------------------------------
    def autocast(self) -> Any:
        """The job's precision as an autocast context for the forward pass (no-op for fp32)."""
        dt = getattr(self, "_autocast_dtype", None)
        if dt is None:  # fp32 (or before attach: the job's own context)
            from dk.pol.torch_adapter import autocast

            return autocast(self.job, torch.device(self.job.train.get("device", "cpu")))
        return torch.autocast(device_type=self._dev_type, dtype=dt)

    def _on_forward(self, module: torch.nn.Module, args: Any) -> None:
        """Forward pre-hook: seed the micro-batch's randomness and check the precision."""
        if not torch.is_grad_enabled() or self._in_dp or self._pausing:
            return  # evaluation, DP-SGD's own per-sample pass, rec.paused(): not the step's
        if not module.training:
            raise JobMismatch("the model is in eval mode during a training step (model.train())")
        dev, want_dt = self._dev_type, self._autocast_dtype
        on = torch.is_autocast_enabled(dev)
        if (want_dt is None) == on or (on and torch.get_autocast_dtype(dev) != want_dt):
            raise JobMismatch(
                f"this job trains in {self._precision}: run the forward pass "
                + ("inside `with rec.autocast():`" if want_dt else "without autocast")
            )
        self._apply_seed(self._step_seed(self.step, self._forwards))
        self._forwards += 1

    def _step_seed(self, step: int, micro: int) -> int:
        """``step_seed(job.seed, step, micro)`` (SPEC §8.3), derived ``SEED_BLOCK`` steps at a
        time: one ChaCha20 stream per seed either way, but in a loop that stays in cache
        instead of once between a backward and a forward pass."""
        seeds = self._seeds
        if not seeds[0] <= step < seeds[0] + SEED_BLOCK or micro >= seeds[1]:
            first, acc = step, max(micro + 1, int(self.job.train.get("accumulation", 1)))
            block = [
                self._derive_seed(self._seed, t, j)
                for t in range(first, first + SEED_BLOCK)
                for j in range(acc)
            ]
            seeds = self._seeds = (first, acc, block)
        return int(seeds[2][(step - seeds[0]) * seeds[1] + micro])

    @staticmethod
    def _after_forward(module: torch.nn.Module, args: Any, out: Any) -> Any:
        """Forward hook (bf16/fp16 jobs): the loss sees float32 outputs (SPEC §12.4)."""
        if torch.is_grad_enabled() and torch.is_tensor(out) and out.dtype != torch.float32:
            return out.float() if out.is_floating_point() else None
        return None

    def _record_loss(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        """Forward hook: the job's loss on this micro-batch's output (SPEC §11.7, §12.4).

        The float32 loss stays a 0-d tensor on the device (no host sync per micro-batch); the
        division by the number of micro-batches and the read-out happen once per interval
        (:class:`dk.pol.loss.LossMeter`). On the CPU the loss is computed under the user's
        autocast, which leaves float32 losses alone (the loss ops run in float32 under CPU
        autocast, tests/unit/pol/test_recorder_fastpaths.py); elsewhere autocast is switched
        off for it, as in the replay.
        """
        if self._in_dp or self._loss is None or not torch.is_grad_enabled() or self._pausing:
            return
        ys = self._ys
        if ys is None or not 0 < self._forwards <= len(ys):
            raise JobMismatch("train on the batches of the loader that attach() returned")
        y = ys[self._forwards - 1]
        if torch.is_tensor(out):
            out = out.detach()
            if out.dtype != torch.float32 and out.is_floating_point():
                out = out.float()
            if y.device != out.device:
                y = y.to(out.device)
        if self._dev_type == "cpu" or not torch.is_autocast_enabled(self._dev_type):
            self._loss.add(self._loss_fn(out, y))
            return
        with torch.autocast(self._dev_type, enabled=False):
            self._loss.add(self._loss_fn(out, y))

    def _check_step_inputs(self, opt: torch.optim.Optimizer) -> None:
        """At ``optimizer.step()``: the job's number of forwards and the job's learning rate."""
        from dk.pol.schedule import lr_at

        acc = int(self.job.train.get("accumulation", 1))
        n, self._forwards = self._forwards, 0
        if self.step >= self.job.steps:
            raise JobMismatch(f"more optimizer steps than the job's {self.job.steps}")
        if n == 0:
            raise JobMismatch(
                f"step {self.step}: optimizer.step() without a training forward pass; call it "
                "exactly once per batch, after backward()"
            )
        if self.engine is None and n != acc:
            raise JobMismatch(
                f"step {self.step} ran {n} training forward pass(es); the job runs {acc} "
                "per step (one per micro-batch the loader yields)"
            )
        want = lr_at(self.job, self.step)
        for g in opt.param_groups:
            if not _lr_close(g["lr"], want):
                raise JobMismatch(
                    f"lr at step {self.step} is {g['lr']:.6g}; the job's "
                    f"{self.job.train['schedule']} schedule says {want:.6g}"
                )
            g["lr"] = want  # the replay's exact value

    def _require_gradients(self) -> None:
        """Refuse a step with no gradient at all: the loop never called ``backward()``, so
        the user's optimizer would step on nothing while the replay steps on the job's loss."""
        for p in self._params:
            if p.grad is not None:
                return
        raise JobMismatch(
            f"step {self.step}: optimizer.step() with no gradients; call loss.backward() on the "
            "job's loss before optimizer.step()"
        )

    def _clip_gradients(self) -> None:
        """The job's clipping (``torch_adapter.clip_gradients``: ``clip_grad_norm_`` with
        ``foreach=False``), bit for bit, with the multiplication left out when the clamped
        coefficient is exactly 1 (then it is the identity): the common case costs the norm.

        On the CPU the per-tensor norms come from one ``torch._foreach_norm`` call and the
        multiplication from one ``torch._foreach_mul_``, whose CPU implementations are the
        per-tensor ``linalg.vector_norm`` and ``mul_`` loops in C++ (the same bits as
        ``foreach=False``, tests/unit/pol/test_recorder_fastpaths.py); elsewhere, and under the
        rounded backend (whose log names each operation, SPEC VI), as the replay computes it."""
        clip = float(self.job.train.get("clip_norm", 0.0))
        if clip <= 0.0:
            return
        grads = [p.grad for p in self._params if p.grad is not None]
        if not grads:
            return
        utils = torch.nn.utils
        if self.rounding is None and all(g.device.type == "cpu" and not g.is_sparse for g in grads):
            norms = torch._foreach_norm(grads, 2.0)
            total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
            coef = torch.clamp(clip / (total + 1e-6), max=1.0)  # clip_grads_with_norm_'s coef
            if not bool(coef == 1.0):  # NaN multiplies too
                self._warn_if_clipped_twice(float(total), clip)
                torch._foreach_mul_(grads, coef)  # its per-tensor mul_ loop, in C++
            return
        total = utils.get_total_norm(grads, 2.0, False, foreach=False)
        if not bool(torch.clamp(clip / (total + 1e-6), max=1.0) == 1.0):  # NaN multiplies too
            self._warn_if_clipped_twice(float(total), clip)
            utils.clip_grads_with_norm_(self._params, clip, total, foreach=False)

    def _warn_if_clipped_twice(self, total: float, clip: float) -> None:
        """Warn (once) when the gradients arrive already clipped to the job's norm.

        Called when the job's clipping is about to scale (``clip / (total + 1e-6) < 1``, so
        ``total > clip − 1e-6``). ``clip_grad_norm_`` scales a norm ``o > clip`` to
        ``clip·o / (o + 1e-6)``, less than ``1e-6`` below ``clip`` (and a float32 rounding
        above it at times), which the job's clipping scales again by a factor just below 1:
        the recorded step is not the replay's, which clips once. So a norm at most
        ``clip·(1 + 2^-20)`` here means the loop clipped too. An unclipped norm lands in that
        window about once in 10^6 steps; hence a warning, not a refusal. Not seen: a loop that
        clips to a smaller norm than the job's, or clips by value.
        """
        if self._clip_warned or not total <= clip * (1.0 + 2.0**-20):
            return
        self._clip_warned = True
        warnings.warn(
            f"step {self.step}: the gradients' global norm is already the job's clip_norm "
            f"({clip:g}): does the loop call clip_grad_norm_? The recorded optimizer.step() "
            "clips by the job's norm itself; clipping twice scales the gradients a second time "
            "and the replay, which clips once, will not match. Leave clipping to dk.",
            UserWarning,
            stacklevel=4,
        )

    def _check_finite(self) -> None:
        """Stop at the first update that made a weight NaN or infinite.

        One reduction over all weights: their flat views (made once, remade only if a
        parameter's storage moved) concatenated and summed; a NaN or infinity anywhere makes
        the sum non-finite. Only then is each tensor looked at (a sum that overflowed on
        finite weights is not a divergence).
        """
        params = self._params
        if not params:
            return
        with torch.no_grad():
            flat = _flat_views(self)
            total = torch.cat(flat).sum() if flat is not None else None
            if total is None:  # mixed dtypes or devices: one norm per tensor
                norms = torch._foreach_norm(cast("list[torch.Tensor]", params), 2.0)
                total = torch.stack(norms).sum()
            if bool(torch.isfinite(total)):
                return
        bad = [
            n
            for n, p in zip(self._param_names, params, strict=True)
            if not bool(torch.isfinite(p.detach()).all())
        ]
        if bad:
            raise TrainingDiverged(
                f"step {self.step}: the update made {bad[:3]} NaN or infinite; recording "
                f"stopped (the run directory holds checkpoints up to step "
                f"{self._ckpt_steps[self._next - 1]})"
            )

    def start_engine(self) -> None:
        """Start recording a run that the step engine computes alone (no torch objects).

        Then call :meth:`engine_step` once per step; ``dk train`` does this in exact mode.
        """
        if self.engine is None:
            raise JobMismatch("start_engine() needs a step engine (exact or zk mode)")
        self._start()

    def engine_step(self) -> None:
        """One step of the engine on the job's batch for the current step."""
        self._kernel_step()
        self._on_step()

    def _start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._writer = CommitWriter(self.run_dir, self.info, self.sampler)
        if self._partial is not None:  # continue from the last committed checkpoint
            self._restore_partial()
        # a resumed run appends to its (rewritten) log, from its last committed checkpoint
        self._writer.start(prev=self._prev_ck, truncate=self._partial is None)
        self._det.__enter__()
        if self.rounding is not None:  # committed by checkpoint 0's line (dk.pol.resume)
            self.info.ext = {**(self.info.ext or {}), "rounding": self.rounding.release}
        if self._partial is None:
            self._snap(0, 0)
        if self.rounding is not None:
            if self._partial is not None:  # SPEC VI: the committed intervals' logs stay
                self.rounding.resume(self._partial)
            self.rounding.begin(self._next - 1)

    def paused(self) -> Any:
        """A context outside the rounding log (SPEC VI), for work that is not the job's step:
        the Recorder's own, or a user's metrics (accuracy, logging) computed inside the loop.
        It must not change what training computes (parameters, gradients, optimizer state):
        a verifier replays the job's step without it. Elsewhere than ``pol.backend =
        "rounded"`` it does nothing.

        >>> with rec.paused():  # doctest: +SKIP
        ...     acc = (model(x).argmax(1) == y).float().mean().item()

        Inside, gradients are off (``torch.no_grad``), and a forward pass is not a training
        forward: no step seed, no loss, no count. A model in train mode still updates its
        BatchNorm running statistics in such a forward, which the job's step does not do: call
        ``model.eval()`` inside and ``model.train()`` before leaving.
        """
        return self._pause(grad=False)

    @contextlib.contextmanager
    def _pause(self, grad: bool = True) -> Iterator[None]:
        """:meth:`paused`, for the Recorder's own work with ``grad`` (its first-interval
        replay runs backward passes)."""
        was, self._pausing = self._pausing, True
        try:
            with self.rounding.paused() if self.rounding is not None else contextlib.nullcontext():
                with contextlib.nullcontext() if grad else torch.no_grad():
                    yield
        finally:
            self._pausing = was

    def _restore_partial(self) -> None:
        """Load the partial run's last checkpoint into the engine or the user's objects."""
        from dk.pol.resume import advance_scheduler, rewrite_log

        p = self._partial
        rewrite_log(self.run_dir, p)
        self.info.checkpoints, self.info.intervals = list(p.checkpoints), list(p.intervals)
        self.step, self._next, self._prev_ck = p.step, p.next_index, p.last
        if self.engine is not None:
            self.engine.restore(p.last)
            if self._model is not None:  # the user's model shows the engine's arrays
                import torch

                for name, prm in self._model.named_parameters():
                    prm.data = torch.from_numpy(self.engine.params[name])
            return
        assert self._model is not None and self._opt is not None
        from dk.pol.torch_adapter import restore

        restore(p.last, self._model, self._opt, self.job, self.codec)
        if self._scheduler is not None:
            advance_scheduler(self._scheduler, p.step)

    # -- recording ---------------------------------------------------------------------
    def _interval_ext(self, index: int) -> dict[str, Any] | None:
        """The ``ext`` object (SPEC §11.5) of the interval ending at checkpoint ``index``: its
        loss, and a rounded run's log (SPEC VI §4, written before the line that commits it)."""
        if index == 0:
            return None
        ext: dict[str, Any] = {}
        if self._loss is not None:
            loss = self._loss.take()
            if not np.isfinite(loss):
                raise TrainingDiverged(
                    f"step {self.step}: the training loss of interval {index - 1} is not "
                    "finite; recording stopped"
                )
            ext[LOSS_KEY] = loss
        if self.rounding is not None:
            ext["rounding_log"] = self.rounding.exts[index - 1]
        return ext or None

    def _snap(self, index: int, step: int) -> None:
        # checkpoint 0's line commits the run's ext (a resume checks it: dk.pol.resume)
        ext = self.info.ext if index == 0 else self._interval_ext(index)
        if self.engine is not None:
            ck = self.engine.snapshot(step, self.sampler.steps_per_epoch)
        else:
            assert self._model is not None and self._opt is not None
            from dk.pol.torch_adapter import check_hidden_state, snapshot

            assert self._hidden is not None  # taken in attach, with the model, before any step
            check_hidden_state(self._model, self._hidden, step)
            ck = snapshot(
                self._model, self._opt, self.job, step, self.sampler.steps_per_epoch, self.codec
            )
        if self.rounding is not None:
            self.rounding.snapped(index, step, ck, self.dataset)
        assert self._writer is not None
        self._writer.put(index, step, ck, ext)

    def dp_grads_(self) -> None:
        """Replace the model's gradients by this step's DP-SGD gradients (SPEC VII §4)."""
        from dk.pol.dp import dp_grads_
        from dk.pol.torch_adapter import batch_tensors, make_loss

        assert self._model is not None and self.dp is not None
        x, y = batch_tensors(self.dataset, self.sampler.batch(self.step))
        loss_fn = make_loss(self.job, self.dataset.output_dim)
        self._in_dp = True
        try:
            dp_grads_(self._model, loss_fn, x, y, dp=self.dp, seed=self.job.seed, step=self.step)
        finally:
            self._in_dp = False

    def _kernel_step(self) -> None:
        """A step engine computes the whole step on this step's batch; the user's torch model
        shares the engine's weight arrays (re-bound only if the engine replaced them), so it
        always shows the current weights without a copy. Its own gradients are not used."""
        assert self.engine is not None
        idx = self.sampler.batch(self.step)
        loss = self.engine.step(self.dataset.X[idx], self.dataset.y[idx])
        if self._loss is not None:
            self._loss.add(loss)
        if self._model is None:
            return
        self._check_user_gradients()
        if not all(np.isfinite(v).all() for v in self.engine.params.values()):
            raise TrainingDiverged(f"step {self.step}: the update made weights NaN or infinite")
        import torch

        for name, p in self._model.named_parameters():
            arr = self.engine.params[name]
            if p.data.data_ptr() != arr.ctypes.data:
                p.data = torch.from_numpy(arr)

    def _check_user_gradients(self) -> None:
        """Exact mode on dk's kernels: the kernel computed the job's step; refuse a loop whose
        own gradients (the user's loss) are not that step's, instead of ignoring them."""
        assert self._model is not None and self.engine is not None
        bufs = getattr(getattr(self.engine, "trainer", None), "_bufs", None)
        if bufs is None:
            return
        num = den = 0.0
        for name, p in self._model.named_parameters():
            ref = bufs.get("g:" + name)
            if ref is None:
                return
            host = ref.copy_to_host() if hasattr(ref, "copy_to_host") else ref
            ref = np.asarray(host, dtype=np.float64)
            if p.grad is None:
                raise JobMismatch(
                    f"step {self.step}: {name} has no gradient; the loop must compute the job's "
                    f"{self.job.train['loss']} loss on the loader's batch and call backward() "
                    "before optimizer.step()"
                )
            d = p.grad.detach().cpu().numpy().astype(np.float64) - ref
            num += fold_sum_inplace(d.ravel() * d.ravel())  # SPEC §1.4: the same on every CPU
            den += fold_sum_inplace(ref.ravel() * ref.ravel())
        rel = (num / den) ** 0.5 if den > 0 else num**0.5
        if rel > GRAD_RTOL:
            raise JobMismatch(
                f"step {self.step}: your loop's gradients differ from the job's step (relative "
                f"difference {rel:.3g}). In exact mode dk's kernels compute the step that is "
                f"proven, so the loop must compute the job's {self.job.train['loss']} loss "
                "(mean over the loader's batch) and nothing else"
            )

    def _on_step(self) -> None:
        if self._loss is not None:
            self._loss.end_step()
        self.step += 1
        if self.step > self._steps:
            raise JobMismatch(f"more optimizer steps than the job's {self._steps}")
        if self.progress is not None:  # at most every 0.1 s, and at the last step
            now = time.monotonic()
            if now >= self._progress_at or self.step == self._steps:
                self._progress_at = now + PROGRESS_PERIOD_S
                self.progress(self.step)
        if self.rounding is not None:
            self.rounding.end_step(self.step - 1)
        if self._next < len(self._ckpt_steps) and self.step == self._ckpt_steps[self._next]:
            if self.rounding is not None:
                self.rounding.end(self._next - 1)
            self._snap(self._next, self.step)
            self._next += 1
            if self.rounding is not None and self._next < len(self._ckpt_steps):
                self.rounding.begin(self._next - 1)

    def finish(self) -> RunInfo:
        """Wait for pending commits, check the run is complete, write ``run.json``."""
        for name in ("_hook", "_post_hook", "_loss_hook"):
            hook = getattr(self, name, None)
            if hook is not None:
                hook.remove()
        if self._writer is None:
            raise JobMismatch("finish() before recording started (attach or start_engine)")
        try:
            written = self._writer.close()
        finally:
            if self.rounding is not None:
                self.rounding.close()
            self._det.__exit__(None, None, None)
        if self.step != self.job.steps:
            raise JobMismatch(f"training stopped at step {self.step} of {self.job.steps}")
        # One durability point for the whole run (not one fsync per checkpoint): every blob
        # and the log reach the disk before run.json (itself written atomically) says complete.
        logs = self.rounding.written if self.rounding is not None else []
        sync_files([*written, *logs])
        self.info.complete = True
        write_run(self.run_dir, self.info)
        return self.info

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.finish()
        elif self._writer is not None:
            if self.rounding is not None:
                self.rounding.close()
            self._writer.abort()
            self._det.__exit__(None, None, None)
