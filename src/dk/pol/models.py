"""The built-in model registry, dk's specified initialiser and initial states (SPEC §9).

Model files and entry points are loaded by :mod:`dk.pol.modelsrc`; this module gives every
job, registry or not, its ``model/*`` tensor specs (:func:`state_specs`), its initial state
(:func:`initial_state`: dk's initialiser, a seeded construction or ``init.safetensors``) and a
torch module (:func:`build_model`).

Architectures (parameter names and shapes follow ``torch.nn.Linear`` / ``nn.Conv2d``):

* ``linear``: ``fc0`` (input_dim → output_dim).
* ``mlp``: ``fc0 … fcL`` over ``hidden``; ``relu`` or exact-erf ``gelu`` between layers.
* ``cnn``: input ``[C, H, W]``; ``conv0`` C→8 3×3 pad 1, ReLU, max-pool 2; ``conv1`` 8→16 3×3
  pad 1, ReLU, max-pool 2; flatten; ``fc0`` 16·H/4·W/4 → output_dim.

Initial weights never come from torch's RNG: every tensor (weights and biases) is
``float32((2u − 1) · b)`` with ``u = uniform_floats(stream_key("init", seed, name), size)`` and
``b = 1/sqrt(fan_in)``, computed in float64 (SPEC §9.2).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from dk.crypto.stream import stream_key, uniform_floats
from dk.errors import FormatError

if TYPE_CHECKING:
    from dk.pol.job import JobSpec

ParamSpec = tuple[str, tuple[int, ...], int]  # (name, shape, fan_in)


def model_dims(model: dict[str, Any]) -> tuple[int, int]:
    """(input_dim, output_dim) of a model spec."""
    if "output_dim" not in model:
        raise FormatError("job: model.output_dim is missing (write the job with `dk job init`)")
    if model["arch"] == "cnn":
        if "input_shape" not in model:
            raise FormatError("job: model.input_shape [C, H, W] is required for the cnn")
        c, h, w = model["input_shape"]
        return c * h * w, int(model["output_dim"])
    if "input_dim" not in model:
        raise FormatError("job: model.input_dim is missing (write the job with `dk job init`)")
    return int(model["input_dim"]), int(model["output_dim"])


def param_specs(model: dict[str, Any]) -> list[ParamSpec]:
    """Parameters of a model spec in registration order."""
    din, dout = model_dims(model)
    arch = model["arch"]
    out: list[ParamSpec] = []
    if arch in ("linear", "mlp"):
        widths = [din, *(model.get("hidden", []) if arch == "mlp" else []), dout]
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            out += [(f"fc{i}.weight", (b, a), a), (f"fc{i}.bias", (b,), a)]
        return out
    if arch == "cnn":
        c, h, w = model["input_shape"]
        out += [("conv0.weight", (8, c, 3, 3), c * 9), ("conv0.bias", (8,), c * 9)]
        out += [("conv1.weight", (16, 8, 3, 3), 72), ("conv1.bias", (16,), 72)]
        flat = 16 * (h // 4) * (w // 4)
        out += [("fc0.weight", (dout, flat), flat), ("fc0.bias", (dout,), flat)]
        return out
    raise FormatError(f"unknown architecture {arch!r}")


def num_parameters(model: dict[str, Any]) -> int:
    """Total parameter count."""
    return sum(math.prod(s) for _, s, _ in param_specs(model))


def init_params(model: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """The job's initial weights (SPEC §9.2)."""
    params = {}
    for name, shape, fan_in in param_specs(model):
        n = math.prod(shape)
        u = uniform_floats(stream_key("init", seed, name.encode("utf-8")), n)
        bound = 1.0 / math.sqrt(fan_in)
        params[name] = ((2.0 * u - 1.0) * bound).astype(np.float32).reshape(shape)
    return params


def build_torch_model(model: dict[str, Any]) -> Any:
    """A ``torch.nn.Module`` of the registry architecture (weights uninitialised)."""
    import torch
    from torch import nn

    din, dout = model_dims(model)
    arch = model["arch"]

    class _Act(nn.Module):
        def __init__(self, kind: str) -> None:
            super().__init__()
            self.kind = kind

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x) if self.kind == "relu" else nn.functional.gelu(x)

    class DkMLP(nn.Module):
        """Registry ``linear`` / ``mlp``."""

        def __init__(self) -> None:
            super().__init__()
            widths = [din, *(model.get("hidden", []) if arch == "mlp" else []), dout]
            self.depth = len(widths) - 1
            for i in range(self.depth):
                setattr(self, f"fc{i}", nn.Linear(widths[i], widths[i + 1]))
            self.act = _Act(model.get("activation", "relu"))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x.reshape(x.shape[0], -1)
            for i in range(self.depth):
                x = getattr(self, f"fc{i}")(x)
                if i < self.depth - 1:
                    x = self.act(x)
            return x

    class DkCNN(nn.Module):
        """Registry ``cnn``."""

        def __init__(self) -> None:
            super().__init__()
            c, h, w = model["input_shape"]
            self.shape = (c, h, w)
            self.conv0 = nn.Conv2d(c, 8, 3, padding=1)
            self.conv1 = nn.Conv2d(8, 16, 3, padding=1)
            self.fc0 = nn.Linear(16 * (h // 4) * (w // 4), dout)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x.reshape(x.shape[0], *self.shape)
            x = nn.functional.max_pool2d(torch.relu(self.conv0(x)), 2)
            x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
            out: torch.Tensor = self.fc0(x.flatten(1))
            return out

    return DkCNN() if arch == "cnn" else DkMLP()


StateSpec = tuple[str, tuple[int, ...], str]  # (name, shape, dtype name)

_CACHE: dict[tuple[bytes, str, str], Any] = {}


def _cached(job: JobSpec, what: str, make: Any) -> Any:
    key = (job.job_id, str(job.base_dir), what)
    if key not in _CACHE:
        if len(_CACHE) > 64:
            _CACHE.clear()
        _CACHE[key] = make()
    return _CACHE[key]


def _custom_state(job: JobSpec) -> dict[str, np.ndarray]:
    from dk.pol.modelsrc import build_custom

    module = build_custom(job)
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def _custom_params(job: JobSpec) -> list[str]:
    from dk.pol.modelsrc import build_custom

    return [n for n, _ in build_custom(job).named_parameters()]


def state_specs(job: JobSpec) -> list[StateSpec]:
    """Every ``model/*`` tensor a checkpoint commits: parameters and buffers (SPEC §10.1)."""
    if not job.is_custom:
        return [(n, s, "float32") for n, s, _ in param_specs(job.model)]

    def make() -> list[StateSpec]:
        return [(k, tuple(v.shape), v.dtype.name) for k, v in _custom_state(job).items()]

    return list(_cached(job, "specs", make))


def param_names(job: JobSpec) -> list[str]:
    """Trainable parameters in registration order (the optimizer's order)."""
    if not job.is_custom:
        return [n for n, _, _ in param_specs(job.model)]
    return list(_cached(job, "params", lambda: _custom_params(job)))


def load_init_file(job: JobSpec) -> dict[str, np.ndarray]:
    """``init.safetensors`` (fine-tuning), checked against ``init.root`` (SPEC §9.2)."""
    from safetensors.numpy import load

    from dk.crypto.encoding import tensors_root
    from dk.crypto.hashing import digests_equal

    path = job.init_path()
    if path is None or not path.is_file() or path.is_symlink():
        raise FormatError(f"initial weights not found: {path}", reason="INIT_MISMATCH")
    if path.stat().st_size > 4 * 1024**3:
        raise FormatError(f"{path} is over 4 GiB", reason="INIT_MISMATCH")
    try:
        tensors = {k: np.asarray(v) for k, v in load(path.read_bytes()).items()}
    except Exception as e:  # safetensors raises its own error type
        raise FormatError(f"{path}: not valid safetensors: {e}", reason="INIT_MISMATCH") from None
    if not digests_equal(tensors_root(tensors), bytes.fromhex(job.init["root"])):
        raise FormatError(f"{path} is not the job's init.root", reason="INIT_MISMATCH")
    return tensors


def initial_state(job: JobSpec) -> dict[str, np.ndarray]:
    """The ``model/*`` tensors of checkpoint 0 by name (SPEC §9.2, §10.2)."""
    method = job.init["method"]
    if method == "dk":
        return init_params(job.model, job.seed)
    if method == "seeded":
        return dict(_cached(job, "init", lambda: _custom_state(job)))
    tensors = load_init_file(job)
    want = {n: (s, d) for n, s, d in state_specs(job)}
    got = {k: (tuple(v.shape), v.dtype.name) for k, v in tensors.items()}
    if got != want:
        extra = sorted(set(got) - set(want))[:3]
        missing = sorted(set(want) - set(got))[:3]
        diff = [k for k in want if k in got and got[k] != want[k]][:3]
        raise FormatError(
            f"init.safetensors does not fit the model: missing {missing} extra {extra} "
            f"shape/dtype differs {diff}",
            reason="INIT_MISMATCH",
        )
    return tensors


def build_model(job: JobSpec) -> Any:
    """The job's model as a torch module on CPU, holding the job's initial state."""
    import torch

    if job.is_custom:
        from dk.pol.modelsrc import build_custom

        module = build_custom(job)
        if job.init["method"] == "file":
            state = {k: torch.from_numpy(v.copy()) for k, v in initial_state(job).items()}
            module.load_state_dict(state, strict=True)
        return module
    module = build_torch_model(job.model)
    with torch.no_grad():
        for name, value in initial_state(job).items():
            module.get_parameter(name).copy_(torch.from_numpy(value))
    return module


def build_fresh(job: JobSpec) -> Any:
    """A module of the job's architecture for replay (its weights are overwritten)."""
    if job.is_custom:
        from dk.pol.modelsrc import build_custom

        return build_custom(job)
    return build_torch_model(job.model)
