"""What one circuit proves: a model, a loss, a learning rate and a batch size (SPEC IV §1).

The models are the registry's ``linear`` and ``mlp`` with torch ``nn.Linear`` naming:
``fc{i}.weight`` has shape ``[out, in]`` and ``fc{i}.bias`` shape ``[out]``; an MLP puts a
ReLU between layers and none after the last. Losses average over the batch like torch's
defaults: ``mse`` is ``F.mse_loss`` (mean over every element of ``[B, D]``) and
``cross_entropy`` is ``F.cross_entropy`` (mean over the batch of softmax cross-entropy, with
the logit spread clamped at :data:`SOFTMAX_CLAMP` inside the softmax). The
optimizer is plain SGD, ``p <- p - lr * grad``. :func:`reference_step` is the float step
every circuit is checked against.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dk.errors import FormatError

ARCHS = ("linear", "mlp")
LOSSES = ("mse", "cross_entropy")
MAX_DIM = 4096
MAX_LAYERS = 8
MAX_BATCH = 1024
#: Softmax sees ``max(z - max(z), -SOFTMAX_CLAMP)``: a logit more than this far below the
#: row's largest gets probability weight ``e**-7`` of the top one instead of less (a change
#: below ``e**-7 < 1e-3`` per probability), which keeps the circuit's exp table bounded.
SOFTMAX_CLAMP = 7.0


@dataclass(frozen=True)
class StepSpec:
    """One SGD step of a registry model: the statement a step circuit proves."""

    arch: str
    input_dim: int
    hidden: tuple[int, ...]
    output_dim: int
    loss: str
    lr: float
    batch_size: int

    @classmethod
    def from_model(
        cls, model: Mapping[str, Any], *, loss: str, lr: float, batch_size: int
    ) -> StepSpec:
        """Build and validate a spec from a registry model description.

        Args:
            model: ``{"arch": "linear"|"mlp", "input_dim": n, "output_dim": m,
                "hidden": [h, ...]}`` (``hidden`` only for ``mlp``).
            loss: ``"mse"`` or ``"cross_entropy"``.
            lr: SGD learning rate (finite, > 0).
            batch_size: rows per batch.

        Returns:
            The validated spec.

        Raises:
            FormatError: on an unknown architecture or loss, or a size out of bounds.
        """
        arch = model.get("arch")
        if arch not in ARCHS:
            raise FormatError(f"circuit: unsupported architecture {arch!r} (have {ARCHS})")
        hidden = tuple(model.get("hidden", ()) or ()) if arch == "mlp" else ()
        if arch == "mlp" and not hidden:
            raise FormatError("circuit: an mlp needs at least one hidden layer")
        spec = cls(
            arch=str(arch),
            input_dim=_dim(model.get("input_dim"), "input_dim"),
            hidden=tuple(_dim(h, "hidden") for h in hidden),
            output_dim=_dim(model.get("output_dim"), "output_dim"),
            loss=str(loss),
            lr=float(lr),
            batch_size=_dim(batch_size, "batch_size", MAX_BATCH),
        )
        if spec.loss not in LOSSES:
            raise FormatError(f"circuit: unsupported loss {loss!r} (have {LOSSES})")
        if not (np.isfinite(spec.lr) and spec.lr > 0):
            raise FormatError(f"circuit: learning rate must be finite and > 0, got {lr!r}")
        if len(spec.hidden) + 1 > MAX_LAYERS:
            raise FormatError(f"circuit: at most {MAX_LAYERS} layers")
        return spec

    @property
    def layer_dims(self) -> list[tuple[int, int]]:
        """``(in, out)`` of each linear layer, first to last."""
        dims = [self.input_dim, *self.hidden, self.output_dim]
        return list(itertools.pairwise(dims))

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Parameter names (sorted) and their shapes, in torch ``nn.Linear`` layout."""
        shapes: dict[str, tuple[int, ...]] = {}
        for i, (n_in, n_out) in enumerate(self.layer_dims):
            shapes[f"fc{i}.weight"] = (n_out, n_in)
            shapes[f"fc{i}.bias"] = (n_out,)
        return dict(sorted(shapes.items()))

    def canonical(self) -> dict[str, Any]:
        """The spec as a JSON-able dict (hashed into the circuit id)."""
        return {
            "arch": self.arch,
            "input_dim": self.input_dim,
            "hidden": list(self.hidden),
            "output_dim": self.output_dim,
            "loss": self.loss,
            "lr": self.lr.hex(),
            "batch_size": self.batch_size,
        }


def _dim(value: Any, what: str, limit: int = MAX_DIM) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise FormatError(f"circuit: {what} must be an integer, got {value!r}")
    if not 1 <= int(value) <= limit:
        raise FormatError(f"circuit: {what} must be in [1, {limit}], got {value}")
    return int(value)


def check_params(spec: StepSpec, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Check names and shapes of a parameter set; return it as float32 arrays, sorted.

    Raises:
        FormatError: on a missing or extra tensor, a wrong shape or a non-finite value.
    """
    shapes = spec.param_shapes()
    if set(params) != set(shapes):
        raise FormatError(
            f"circuit: parameters {sorted(params)} do not match the model's {sorted(shapes)}"
        )
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        arr = np.asarray(params[name])
        if arr.shape != shape:
            raise FormatError(f"circuit: {name} has shape {arr.shape}, expected {shape}")
        arr = arr.astype(np.float32)
        if not np.all(np.isfinite(arr)):
            raise FormatError(f"circuit: {name} holds a non-finite value")
        out[name] = arr
    return out


def batch_arrays(spec: StepSpec, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate a batch and return ``(x, targets)`` as float32, ``[B, in]`` and ``[B, out]``.

    ``y`` is either integer class labels ``[B]`` (one-hot encoded here, for either loss) or
    float targets ``[B, out]``.

    Raises:
        FormatError: on a wrong shape, a label out of range or a non-finite value.
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if x.shape != (spec.batch_size, spec.input_dim):
        raise FormatError(
            f"circuit: batch x has shape {x.shape}, expected {(spec.batch_size, spec.input_dim)}"
        )
    if y.ndim == 1 and np.issubdtype(y.dtype, np.integer):
        if y.shape[0] != spec.batch_size or y.min() < 0 or y.max() >= spec.output_dim:
            raise FormatError("circuit: class labels do not fit the batch or the output size")
        targets = np.zeros((spec.batch_size, spec.output_dim), dtype=np.float32)
        targets[np.arange(spec.batch_size), y] = 1.0
    elif y.shape == (spec.batch_size, spec.output_dim):
        if spec.loss == "cross_entropy":
            raise FormatError("circuit: cross_entropy takes integer class labels")
        targets = y.astype(np.float32)
    else:
        raise FormatError(f"circuit: batch y has shape {y.shape}, dtype {y.dtype}")
    x = x.astype(np.float32)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(targets))):
        raise FormatError("circuit: the batch holds a non-finite value")
    return x, targets


def reference_step(
    spec: StepSpec, params: Mapping[str, np.ndarray], x: np.ndarray, targets: np.ndarray
) -> dict[str, np.ndarray]:
    """One float64 SGD step with the hand-derived backward the circuit also uses.

    Args:
        spec: the step.
        params: float parameters (``check_params`` layout).
        x: ``[B, in]`` inputs.
        targets: ``[B, out]`` float targets (one-hot for class labels).

    Returns:
        The new parameters, float64, keyed by name.
    """
    n = len(spec.layer_dims)
    w = [np.asarray(params[f"fc{i}.weight"], np.float64) for i in range(n)]
    b = [np.asarray(params[f"fc{i}.bias"], np.float64) for i in range(n)]
    acts = [np.asarray(x, np.float64)]
    pre = []
    for i in range(n):
        z = acts[-1] @ w[i].T + b[i]
        pre.append(z)
        if i < n - 1:
            acts.append(np.maximum(z, 0.0))
    out = pre[-1]
    t = np.asarray(targets, np.float64)
    if spec.loss == "mse":
        dz = (out - t) * (2.0 / out.size)
    else:
        e = np.exp(np.maximum(out - out.max(axis=1, keepdims=True), -SOFTMAX_CLAMP))
        dz = (e / e.sum(axis=1, keepdims=True) - t) / spec.batch_size
    new: dict[str, np.ndarray] = {}
    for i in reversed(range(n)):
        new[f"fc{i}.weight"] = w[i] - spec.lr * (dz.T @ acts[i])
        new[f"fc{i}.bias"] = b[i] - spec.lr * dz.sum(axis=0)
        if i > 0:
            dz = (dz @ w[i]) * (pre[i - 1] > 0)
    return dict(sorted(new.items()))
