"""Record a PoL transcript from a user's own PyTorch loop (opacus-style ``attach``).

>>> rec = Recorder(job, "run/")                                     # doctest: +SKIP
>>> model, optimizer, loader = rec.attach(model=build_model(job),   # doctest: +SKIP
...     optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
>>> for x, y in loader:                                             # doctest: +SKIP
...     optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
>>> info = rec.finish()                                             # doctest: +SKIP

``attach`` checks that the model, optimizer and loader are the job's, and returns the model,
the optimizer wrapped so that each ``step()`` is counted, and a loader that yields the job's
batches in the job's order. Every ``k`` steps a snapshot is taken; hashing and writing happen
on a background thread so training is not held up.
"""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dk.crypto.hashing import digests_equal
from dk.errors import DkError, FormatError
from dk.pol.checkpoint import Tensors, checkpoint_root, update_norm, write_blob
from dk.pol.data import Dataset, check_dims, load_dataset
from dk.pol.job import JobSpec, as_job
from dk.pol.models import job_init_params, param_specs
from dk.pol.run import CheckpointEntry, IntervalEntry, RunInfo, write_run
from dk.pol.sampler import job_sampler
from dk.pol.torch_adapter import batch_tensors, deterministic, make_codec, snapshot


class JobMismatch(DkError, ValueError):
    """The model, optimizer or loader handed to ``attach`` is not the job's."""


def check_data(job: JobSpec, dataset: Dataset) -> None:
    """Raise unless the dataset's commitment equals the job's ``data.root``."""
    want = job.data.get("root", "")
    if want and not digests_equal(dataset.root(), bytes.fromhex(want)):
        raise FormatError("the dataset does not match the job's data.root", reason="DATA_MISMATCH")


class _RecordedOptimizer:
    """Delegates to the user's optimizer and tells the recorder about each ``step()``."""

    def __init__(self, inner: torch.optim.Optimizer, recorder: Recorder) -> None:
        self._inner, self._recorder = inner, recorder

    def step(self, closure: Any = None) -> Any:
        rec = self._recorder
        if rec.engine is not None:  # a step engine (dk kernels, zk circuit) does the whole step
            rec._kernel_step()
            rec._on_step()
            return None
        if rec.codec is not None and rec._model is not None:  # compressed job: SPEC Part III
            rec.codec.compress_grads_(rec._model.named_parameters())
        if rec.dp is not None and rec._model is not None:  # DP-SGD: SPEC Part VII §4
            rec.dp_grads_()
        out = self._inner.step(closure)
        self._recorder._on_step()
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class JobLoader:
    """Yields ``(x, y)`` torch batches of the job, one per remaining step."""

    def __init__(self, recorder: Recorder) -> None:
        self._rec = recorder

    def __len__(self) -> int:
        return self._rec.job.steps - self._rec.step

    def __iter__(self) -> Any:
        rec = self._rec
        for t in range(rec.step, rec.job.steps):
            if rec.step != t:
                raise JobMismatch(
                    "optimizer.step() must be called exactly once per batch "
                    f"(step {rec.step}, batch {t})"
                )
            yield batch_tensors(rec.dataset, rec.sampler.batch(t))


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
    ) -> None:
        self.job = as_job(job)
        self.run_dir = Path(run_dir)
        self.dataset = dataset if dataset is not None else load_dataset(self.job)
        check_data(self.job, self.dataset)
        check_dims(self.job, self.dataset)
        self.sampler = job_sampler(self.job, len(self.dataset))
        self.step = 0
        self.progress = progress
        self._ckpt_steps = self.job.checkpoint_steps()
        self._next = 1
        self._model: torch.nn.Module | None = None
        self._opt: torch.optim.Optimizer | None = None
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self.codec = make_codec(self.job)
        self.dp = self.job.train.get("dp")
        if self.dp is not None:  # refuse a budget the job does not allow, before training
            from dk.pol.dp import check_budget

            self.dp_epsilon = check_budget(self.job, len(self.dataset))
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
        self._det = deterministic(
            1 if engine is None and self.job.mode in ("exact", "zk") else None
        )
        self.info = RunInfo(
            job_id=self.job.job_id.hex(),
            data_root=self.dataset.root().hex(),
            interval=self.job.interval,
            steps=self.job.steps,
        )

    # -- attach ------------------------------------------------------------------------
    def _check_model(self, model: torch.nn.Module) -> None:
        got = {n: tuple(p.shape) for n, p in model.named_parameters()}
        want = {n: s for n, s, _ in param_specs(self.job.model)}
        if got != want:
            raise JobMismatch(
                f"model parameters {got} are not the job's {self.job.model['arch']} {want}"
            )
        for name, value in job_init_params(self.job).items():
            if not np.array_equal(model.get_parameter(name).detach().numpy(), value):
                raise JobMismatch(
                    f"model weight {name} is not the job's initial weight "
                    "(use dk.pol.build_model(job))"
                )

    def _check_optimizer(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
        t = self.job.train
        cls = torch.optim.SGD if t["optimizer"] == "sgd" else torch.optim.Adam
        if type(optimizer) is not cls:
            raise JobMismatch(f"optimizer must be torch.optim.{cls.__name__} for this job")
        if len(optimizer.param_groups) != 1:
            raise JobMismatch("optimizer must have exactly one parameter group")
        g = optimizer.param_groups[0]
        if [id(p) for p in g["params"]] != [id(p) for p in model.parameters()]:
            raise JobMismatch("optimizer must hold the model's parameters in model order")
        want: dict[str, Any] = {"lr": t["lr"], "weight_decay": t["weight_decay"], "maximize": False}
        if t["optimizer"] == "sgd":
            want.update(momentum=t["momentum"], dampening=0, nesterov=False)
        else:
            want.update(betas=tuple(t["betas"]), eps=t["eps"], amsgrad=False)
        for k, v in want.items():
            got = tuple(g[k]) if isinstance(g.get(k), list | tuple) else g.get(k)
            if got != v:
                raise JobMismatch(f"optimizer {k}={got!r}, the job says {v!r}")
        # Options that change the update rule (absent in older torch releases: default False).
        for k in ("decoupled_weight_decay", "capturable", "differentiable"):
            if g.get(k, False):
                raise JobMismatch(f"optimizer {k}=True is not the job's update rule (the replay's)")
        if g.get("foreach") or g.get("fused"):
            raise JobMismatch("use foreach=False and fused=False (the replay's implementation)")
        if optimizer.state:
            raise JobMismatch("optimizer already has state; attach before the first step")

    def attach(
        self, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any = None
    ) -> tuple[torch.nn.Module, Any, JobLoader]:
        """Check the user's objects against the job and start recording."""
        self._check_model(model)
        self._check_optimizer(optimizer, model)
        if loader is not None:
            bs = getattr(loader, "batch_size", None)
            ds = getattr(loader, "dataset", None)
            if bs is not None and bs != self.job.train["batch_size"]:
                raise JobMismatch(
                    f"loader batch_size {bs}, the job says {self.job.train['batch_size']}"
                )
            if ds is not None and hasattr(ds, "__len__") and len(ds) != len(self.dataset):
                raise JobMismatch(
                    f"loader dataset has {len(ds)} samples, the job's has {len(self.dataset)}"
                )
        self._model, self._opt = model, optimizer
        self._start()
        return model, _RecordedOptimizer(optimizer, self), JobLoader(self)

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
        (self.run_dir / "run.log.jsonl").write_text("")
        self._det.__enter__()
        self._thread = threading.Thread(target=self._commit_loop, name="dk-commit", daemon=True)
        self._thread.start()
        self._snap(0, 0)

    # -- recording ---------------------------------------------------------------------
    def _snap(self, index: int, step: int) -> None:
        if self.engine is not None:
            ck = self.engine.snapshot(step, self.sampler.steps_per_epoch)
        else:
            assert self._model is not None and self._opt is not None
            ck = snapshot(
                self._model, self._opt, self.job, step, self.sampler.steps_per_epoch, self.codec
            )
        self._put((index, step, ck))

    def dp_grads_(self) -> None:
        """Replace the model's gradients by this step's DP-SGD gradients (SPEC VII §4)."""
        from dk.pol.dp import dp_grads_
        from dk.pol.torch_adapter import batch_tensors, make_loss

        assert self._model is not None and self.dp is not None
        x, y = batch_tensors(self.dataset, self.sampler.batch(self.step))
        loss_fn = make_loss(self.job, self.dataset.output_dim)
        dp_grads_(self._model, loss_fn, x, y, dp=self.dp, seed=self.job.seed, step=self.step)

    def _kernel_step(self) -> None:
        """A step engine computes the whole step on this step's batch; the user's torch model
        shares the engine's weight arrays (re-bound only if the engine replaced them), so it
        always shows the current weights without a copy. Its own gradients are not used."""
        assert self.engine is not None
        idx = self.sampler.batch(self.step)
        self.engine.step(self.dataset.X[idx], self.dataset.y[idx])
        if self._model is None:
            return
        for name, p in self._model.named_parameters():
            arr = self.engine.params[name]
            if p.data.data_ptr() != arr.ctypes.data:
                p.data = torch.from_numpy(arr)

    def _put(self, item: Any) -> None:
        while True:
            if self._error is not None:
                raise self._error
            try:
                self._queue.put(item, timeout=0.5)
            except queue.Full:
                continue
            return

    def _on_step(self) -> None:
        self.step += 1
        if self.step > self.job.steps:
            raise JobMismatch(f"more optimizer steps than the job's {self.job.steps}")
        if self.progress is not None:
            self.progress(self.step)
        if self._next < len(self._ckpt_steps) and self.step == self._ckpt_steps[self._next]:
            self._snap(self._next, self.step)
            self._next += 1

    def _commit_loop(self) -> None:
        prev: Tensors | None = None
        log = open(self.run_dir / "run.log.jsonl", "a", encoding="utf-8")
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                index, step, ck = item
                root = checkpoint_root(ck)
                _, _, nbytes = write_blob(self.run_dir, ck, root)
                entry = CheckpointEntry(index=index, step=step, root=root.hex(), nbytes=nbytes)
                self.info.checkpoints.append(entry)
                line: dict[str, Any] = {"checkpoint": entry.__dict__}
                if prev is not None:
                    start = self.info.checkpoints[index - 1].step
                    iv = IntervalEntry(
                        index=index - 1,
                        start_step=start,
                        end_step=step,
                        batch_commitment=self.sampler.batch_commitment(
                            index - 1, start, step
                        ).hex(),
                        update_norm=update_norm(prev, ck),
                    )
                    self.info.intervals.append(iv)
                    line["interval"] = iv.__dict__
                log.write(json.dumps(line) + "\n")
                log.flush()
                prev = ck
        except BaseException as e:  # surfaced in the training thread
            self._error = e
            while True:  # drain so the producer never blocks forever
                try:
                    if self._queue.get(timeout=1.0) is None:
                        return
                except queue.Empty:
                    return
        finally:
            log.close()

    def finish(self) -> RunInfo:
        """Wait for pending commits, check the run is complete, write ``run.json``."""
        try:
            self._queue.put(None)
            self._thread.join()
        finally:
            self._det.__exit__(None, None, None)
        if self._error is not None:
            raise self._error
        if self.step != self.job.steps:
            raise JobMismatch(f"training stopped at step {self.step} of {self.job.steps}")
        self.info.complete = True
        write_run(self.run_dir, self.info)
        return self.info

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.finish()
        elif hasattr(self, "_thread"):
            self._queue.put(None)
            self._thread.join()
            self._det.__exit__(None, None, None)
