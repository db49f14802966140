"""The built-in model registry and dk's specified initialiser (SPEC §9).

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
from typing import Any

import numpy as np

from dk.crypto.stream import stream_key, uniform_floats
from dk.errors import FormatError

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


def job_init_params(job: Any) -> dict[str, np.ndarray]:
    """The job's initial weights: the ``model.init_path`` file if the job names one (its
    weights pinned by ``pol.init_root``), else derived from the seed (SPEC §9.2)."""
    path = job.init_path() if hasattr(job, "init_path") else None
    if path is None:
        return init_params(job.model, job.seed)
    from dk.errors import FormatError
    from dk.pol.checkpoint import parse_blob, read_blob_file

    tensors = parse_blob(read_blob_file(path))
    want = {name: tuple(shape) for name, shape, _ in param_specs(job.model)}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if got != want or any(
        v.dtype != np.float32 or not np.isfinite(v).all() for v in tensors.values()
    ):
        raise FormatError(
            f"initial weights {path.name}: need finite float32 tensors {want}",
            reason="INIT_MISMATCH",
        )
    return {k: np.ascontiguousarray(tensors[k]) for k in want}


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
            return self.fc0(x.flatten(1))

    return DkCNN() if arch == "cnn" else DkMLP()


def build_model(job: Any) -> Any:
    """The job's model as a torch module, holding the job's initial weights."""
    import torch

    module = build_torch_model(job.model)
    with torch.no_grad():
        for name, value in job_init_params(job).items():
            module.get_parameter(name).copy_(torch.from_numpy(value))
    return module
