"""PyTorch adapter: optimizer, loss, snapshot/restore and the canonical training step.

One training step, the same in ``dk train``, a user's loop under :class:`~dk.pol.Recorder`
and the verifier's replay (SPEC §12.4)::

    optimizer.zero_grad(set_to_none=True)
    set every group's lr to lr_at(job, t)
    for j, (x_j, y_j) in enumerate(micro-batches of the (augmented) batch):
        seed_step(seed, t, j)
        with autocast(precision): out = model(x_j)
        (loss_fn(out, y_j) / accumulation).backward()
    clip_grad_norm_(parameters, clip_norm)        # when clip_norm > 0
    optimizer.step()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from dk.pol.checkpoint import Tensors, hparam_tensors, meta_tensors

if TYPE_CHECKING:
    from dk.pol.job import JobSpec


def make_optimizer(job: JobSpec, params: Any) -> torch.optim.Optimizer:
    """The job's optimizer over ``params`` (single-tensor implementation, never foreach)."""
    t = job.train
    if t["optimizer"] == "sgd":
        return torch.optim.SGD(
            params,
            lr=t["lr"],
            momentum=t["momentum"],
            weight_decay=t["weight_decay"],
            nesterov=bool(t.get("nesterov", False)),
            foreach=False,
        )
    cls = torch.optim.AdamW if t["optimizer"] == "adamw" else torch.optim.Adam
    return cls(
        params,
        lr=t["lr"],
        betas=tuple(t["betas"]),
        eps=t["eps"],
        weight_decay=t["weight_decay"],
        foreach=False,
    )


def make_loss(job: JobSpec, output_dim: int | None = None) -> Any:
    """The job's loss as ``f(logits, y) -> scalar`` (mean over the batch, SPEC §6.1).

    ``next_token_cross_entropy`` takes logits ``(B, T, V)`` and targets ``(B, T)``.
    """
    kind = job.train["loss"]
    smooth = float(job.train.get("label_smoothing", 0.0))
    if kind == "cross_entropy":
        return lambda out, y: F.cross_entropy(out.float(), y, label_smoothing=smooth)
    if kind == "next_token_cross_entropy":

        def next_token(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            v = out.shape[-1]
            return F.cross_entropy(
                out.float().reshape(-1, v), y.reshape(-1).long(), label_smoothing=smooth
            )

        return next_token

    def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = out.float()
        width = output_dim if output_dim is not None else out.shape[-1]
        target = F.one_hot(y, width).to(out.dtype) if y.dtype == torch.int64 else y
        return F.mse_loss(out, target)

    return mse


@contextlib.contextmanager
def deterministic(threads: int | None = 1) -> Iterator[None]:
    """Pin torch to ``threads`` intra-op threads and deterministic algorithms, then restore."""
    old_threads = torch.get_num_threads()
    old_det = torch.are_deterministic_algorithms_enabled()
    if threads is not None:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        if torch.are_deterministic_algorithms_enabled() != old_det:  # (imports torch._dynamo)
            torch.use_deterministic_algorithms(old_det)


_ADAM_KEYS = ("exp_avg", "exp_avg_sq", "step")
_STATE_KEYS = {"sgd": ("momentum_buffer",), "adam": _ADAM_KEYS, "adamw": _ADAM_KEYS}


def make_codec(job: JobSpec) -> Any:
    """The job's gradient codec state machine, or None without compression (SPEC §10.1)."""
    spec = job.train.get("compression", "")
    if not spec:
        return None
    from dk.compress import CompressedSGDStep

    return CompressedSGDStep(spec)


def compress_hook(codec: Any) -> Any:
    """A ``grad_hook`` for :func:`train_step` that compresses gradients with ``codec``."""
    if codec is None:
        return None
    return lambda model: codec.compress_grads_(model.named_parameters())


def snapshot(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    job: JobSpec,
    step: int,
    steps_per_epoch: int,
    codec: Any = None,
) -> Tensors:
    """Copy the training state at ``step`` into a checkpoint tensor set (SPEC §10.1):
    every parameter and buffer, the optimizer state, hyperparameters and step."""
    ck: Tensors = {}
    for name, v in model.state_dict(keep_vars=True).items():
        ck[f"model/{name}"] = v.detach().cpu().numpy().copy()
    for name, p in model.named_parameters():
        state = optimizer.state.get(p, {})
        for key in _STATE_KEYS[job.train["optimizer"]]:
            v = state.get(key)
            if v is not None:
                arr = v.detach().cpu().numpy() if torch.is_tensor(v) else np.asarray(v)
                ck[f"optim/{name}/{key}"] = arr.astype(np.float32, copy=True)
    ck.update(hparam_tensors(job))
    ck.update(meta_tensors(job, step, steps_per_epoch))
    if codec is not None:
        ck.update(codec.state_dict())
    return ck


_SCALARS = (bool, int, float, complex, str, bytes, type(None))


def hidden_state(model: torch.nn.Module) -> dict[str, Any]:
    """What of ``model``'s state a checkpoint does not hold (SPEC §10.1): each module's
    non-persistent buffers (copied) and its public attributes of plain scalar types (``int``,
    ``float``, ``str``, ...; ``training`` aside), by dotted name. A replay starts from a
    checkpoint and a freshly built model, so a model that changes any of these while it trains
    cannot be replayed: :func:`check_hidden_state` refuses it when the worker records."""
    out: dict[str, Any] = {}
    for mod_name, mod in model.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        for name in sorted(getattr(mod, "_non_persistent_buffers_set", ())):
            buf = mod._buffers.get(name)
            if buf is not None:
                out[prefix + name] = buf.detach().to("cpu", copy=True)
        for name, v in vars(mod).items():
            if not name.startswith("_") and name != "training" and type(v) in _SCALARS:
                out[prefix + name] = v
    return out


def reset_hidden_state(model: torch.nn.Module, saved: Mapping[str, Any]) -> None:
    """Put ``model``'s :func:`hidden_state` back to ``saved`` (taken from it when it was
    built): a replay of any interval starts from a fresh model's, whichever intervals the
    same model replayed before (the verdict does not depend on the challenge's order)."""
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, v in saved.items():
            mod_name, _, attr = name.rpartition(".")
            mod = modules[mod_name]
            if isinstance(v, torch.Tensor):
                buf = mod._buffers.get(attr)
                if buf is None or buf.shape != v.shape or buf.dtype != v.dtype:
                    mod._buffers[attr] = v.to(next(iter(model.parameters()), v).device, copy=True)
                else:
                    buf.copy_(v)
            else:
                setattr(mod, attr, v)


def check_hidden_state(model: torch.nn.Module, before: Mapping[str, Any], step: int) -> None:
    """Raise :class:`~dk.errors.JobMismatch` if ``model``'s :func:`hidden_state` is no longer
    ``before`` (taken when recording began), naming the first difference."""
    from dk.errors import JobMismatch

    now = hidden_state(model)
    for name in sorted(set(before) | set(now)):
        a, b = before.get(name), now.get(name)
        same = (  # NaN stays NaN: unchanged
            a.dtype == b.dtype
            and a.shape == b.shape
            and bool(
                torch.equal(a, b)  # NaN in float buffers: bit for bit otherwise
                or (
                    a.is_floating_point()
                    and torch.equal(a.isnan(), b.isnan())
                    and torch.equal(a.masked_fill(a.isnan(), 0), b.masked_fill(b.isnan(), 0))
                )
            )
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            else type(a) is type(b) and (a == b or (a != a and b != b))
        )
        if not same:
            what = (
                "a non-persistent buffer"
                if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)
                else f"an attribute ({a!r} -> {b!r})"
            )
            raise JobMismatch(
                f"model state outside the checkpoint changed by step {step}: `{name}`, {what}; "
                "a verifier replays each interval from its checkpoint and a fresh model, so it "
                "could not follow it. Keep that state in a persistent buffer "
                "(register_buffer(..., persistent=True)) or leave it unchanged (SPEC §10.1)"
            )


def restore(
    ck: Mapping[str, np.ndarray],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    job: JobSpec,
    codec: Any = None,
) -> None:
    """Load a checkpoint's parameters, buffers, optimizer state and codec state."""
    if codec is not None:
        codec.load_state_dict(ck)
    with torch.no_grad():
        for name, v in model.state_dict(keep_vars=True).items():
            v.copy_(torch.from_numpy(np.array(ck[f"model/{name}"])))
        for name, p in model.named_parameters():
            optimizer.state.pop(p, None)
            state = {}
            for key in _STATE_KEYS[job.train["optimizer"]]:
                v = ck.get(f"optim/{name}/{key}")
                if v is not None:
                    state[key] = torch.from_numpy(np.array(v, dtype=np.float32)).to(p.device)
                    if key == "step":  # torch keeps Adam's step on CPU unless capturable
                        state[key] = state[key].cpu()
            if state:
                optimizer.state[p] = state


def batch_arrays(dataset: Any, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The batch at ``indices`` as NumPy arrays (the dataset's own ``batch`` if it has one)."""
    get = getattr(dataset, "batch", None)
    if callable(get):
        x, y = get(indices)
        return np.asarray(x), np.asarray(y)
    return dataset.X[indices], dataset.y[indices]


def batch_tensors(dataset: Any, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch at ``indices`` as torch tensors."""
    x, y = batch_arrays(dataset, indices)
    return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))


def job_batch(
    job: JobSpec, dataset: Any, sampler: Any, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s batch with the job's augmentation (SPEC §8.3), on CPU."""
    from dk.pol.augment import augment_batch

    x, y = batch_arrays(dataset, sampler.batch(step))
    if job.train.get("augment"):
        x = augment_batch(job, step, x)
    return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))


_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(job: JobSpec, device: str | None = None) -> torch.device:
    """The device to train or replay on: ``device`` if given, else the job's ``train.device``.

    Raises:
        BackendUnavailable: a CUDA device on a machine without CUDA.
    """
    want = device or job.train.get("device", "cpu")
    if want.startswith("cuda") and not torch.cuda.is_available():
        from dk.errors import BackendUnavailable

        why = "device 'cuda' was asked for" if device else "this job trains on cuda (train.device)"
        raise BackendUnavailable(f"{why} but torch sees no CUDA device here")
    return torch.device(want)


def replay_device(job: JobSpec, device: str | None = None) -> torch.device:
    """Where a verifier replays: ``device`` if given; else the job's device where this machine
    has it, otherwise the CPU (a tolerant replay of a CUDA run on a CPU is legitimate).

    Raises:
        BackendUnavailable: a job whose replay is bit-exact on its own device type only, off
            it: a rounded bf16 job (SPEC VI §6: autocast casts other operations on the CPU than
            on CUDA, so the sites differ) or an exact job on the ``torch`` backend (same machine
            only, SPEC §12.3). A verifier's missing device is never the worker's fault.
    """
    if device is not None:
        dev = resolve_device(job, device)
    else:
        want = job.train.get("device", "cpu")
        dev = torch.device("cuda" if want == "cuda" and torch.cuda.is_available() else "cpu")
    own = str(job.train.get("device", "cpu")).split(":")[0]
    backend = job.pol.get("backend")
    rounded_bf16 = backend == "rounded" and job.train.get("precision") == "bf16"
    exact_torch = job.mode == "exact" and backend == "torch"
    if (rounded_bf16 or exact_torch) and dev.type != own:
        from dk.errors import BackendUnavailable

        why = "autocast casts other operations" if rounded_bf16 else "torch's kernels differ"
        raise BackendUnavailable(
            f"this job trained on {own} replays bit for bit on {own} only ({why} on "
            f"{dev.type}, SPEC VI §6 / §12.3); this verifier would replay on {dev.type}"
        )
    return dev


def autocast(job: JobSpec, device: torch.device) -> Any:
    """The job's precision as an autocast context (a no-op for fp32, SPEC §6.1)."""
    dt = _AUTOCAST.get(job.train.get("precision", "fp32"))
    if dt is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dt)


def clip_gradients(job: JobSpec, params: Any) -> None:
    """Clip the gradients' global L2 norm to ``train.clip_norm`` (0 = off)."""
    c = float(job.train.get("clip_norm", 0.0))
    if c > 0.0:
        torch.nn.utils.clip_grad_norm_(params, c, foreach=False)


def set_lr(job: JobSpec, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Set every group's lr to the job's schedule at ``step`` (SPEC §8.4)."""
    from dk.pol.schedule import lr_at

    lr = lr_at(job, step)
    for g in optimizer.param_groups:
        g["lr"] = lr


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    grad_hook: Any = None,
    *,
    job: JobSpec | None = None,
    step: int = 0,
    device: torch.device | None = None,
) -> float:
    """One canonical step (SPEC §12.4); ``grad_hook(model)`` may transform gradients.

    With ``job``: the schedule's lr, ``accumulation`` micro-batches (each seeded by
    :func:`dk.pol.augment.seed_step`, loss divided by their count), autocast in the job's
    precision, clipping by global norm, then the optimizer's step. Returns the mean loss.
    """
    optimizer.zero_grad(set_to_none=True)
    if job is None:
        loss = loss_fn(model(x), y)
        loss.backward()
        if grad_hook is not None:
            grad_hook(model)
        optimizer.step()
        return float(loss.detach())
    from dk.pol.augment import seed_step

    dev = device or torch.device("cpu")
    set_lr(job, optimizer, step)
    acc = int(job.train.get("accumulation", 1))
    xs, ys = x.chunk(acc), y.chunk(acc)
    total = 0.0
    for j in range(acc):
        xj, yj = xs[j].to(dev), ys[j].to(dev)
        seed_step(job.seed, step, j)
        with autocast(job, dev):
            out = model(xj)
        if torch.is_tensor(out) and out.is_floating_point():
            out = out.float()  # the loss sees float32 outputs, as under the Recorder
        loss = loss_fn(out, yj) / acc
        loss.backward()
        total += float(loss.detach())
    if grad_hook is not None:
        grad_hook(model)
    clip_gradients(job, model.parameters())
    optimizer.step()
    return total
