"""Exact-mode optimizers: SGD with momentum and Adam, float32 state (SPEC II §5).

Hyperparameters are rounded to float32 once. Adam's bias corrections ``1 - beta**t`` are
computed on the host in float64 by exponentiation by squaring (only correctly rounded
multiplications, so every IEEE-754 platform gets the same value) and then rounded to float32.

State entries (names follow the checkpoint convention):

* SGD with momentum: ``"<param>/momentum_buffer"`` (absent before the first step).
* Adam: ``"<param>/exp_avg"``, ``"<param>/exp_avg_sq"`` and ``"<param>/step"`` (float32, shape
  ``()``), all absent before the first step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dk.errors import FormatError

F32 = np.float32
MAX_STEP = 1 << 24  # float32 counts exactly up to here


def _hyper(spec: dict[str, Any], key: str, default: float | None = None) -> float:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise FormatError(f"exact mode: optimizer.{key} must be a finite number")
    if value < 0:
        raise FormatError(f"exact mode: optimizer.{key} must be >= 0")
    return float(value)


def pow_int(base: float, n: int) -> float:
    """``base**n`` in float64 by exponentiation by squaring (platform independent)."""
    result, sq = 1.0, base
    while n:
        if n & 1:
            result *= sq
        sq *= sq
        n >>= 1
    return result


@dataclass(frozen=True)
class Optimizer:
    """A parsed exact-mode optimizer."""

    name: str
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def apply(
        self,
        be: Any,
        specs: list[Any],
        params: dict[str, Any],
        grads: dict[str, Any],
        state: dict[str, Any],
        buf: Any,
    ) -> None:
        """Update every parameter in place on backend ``be`` and write the state back."""
        wd_flag = 1 if F32(self.weight_decay) != 0 else 0
        for name, shape in specs:
            if self.name == "sgd":
                self._sgd(be, name, shape, params[name], grads[name], state, buf, wd_flag)
            else:
                self._adam(be, name, shape, params[name], grads[name], state, wd_flag)

    def _sgd(self, be, name, shape, p, g, state, buf, wd_flag) -> None:  # type: ignore[no-untyped-def]
        key = f"{name}/momentum_buffer"
        flags = wd_flag
        if F32(self.momentum) != 0:
            flags |= 2
            host = state.get(key)
            if host is None:
                flags |= 4
                host = np.zeros(shape, dtype=np.float32)
                state[key] = host
            _check_state(key, host, shape)
            mb = be.asarray(host)
        else:
            mb = buf("sgd_scratch:" + name, shape)
        be.sgd(p, g, mb, F32(self.lr), F32(self.momentum), F32(self.weight_decay), flags)
        if flags & 2:
            be.to_host(mb, state[key])

    def _adam(self, be, name, shape, p, g, state, wd_flag) -> None:  # type: ignore[no-untyped-def]
        keys = (f"{name}/exp_avg", f"{name}/exp_avg_sq", f"{name}/step")
        if keys[2] not in state:
            state[keys[0]] = np.zeros(shape, dtype=np.float32)
            state[keys[1]] = np.zeros(shape, dtype=np.float32)
            state[keys[2]] = np.zeros((), dtype=np.float32)
        for key, want in zip(keys, (shape, shape, ()), strict=True):
            _check_state(key, state.get(key), want)
        step = float(state[keys[2]])
        if step != int(step) or not 0 <= step < MAX_STEP:
            raise FormatError(
                f"exact mode: {keys[2]} must be an integer in [0, 2**24)", reason="REPLAY_MISMATCH"
            )
        t = int(step) + 1
        b1, b2 = self.beta1, self.beta2
        hyper = np.array(
            [self.lr, b1, 1.0 - b1, b2, 1.0 - b2, self.eps, self.weight_decay,
             1.0 - pow_int(b1, t), 1.0 - pow_int(b2, t)],
            dtype=np.float32,
        )  # fmt: skip
        if hyper[7] == 0 or hyper[8] == 0:
            raise FormatError(
                "exact mode: Adam bias correction rounds to zero (beta too close to 1)"
            )
        m, v = be.asarray(state[keys[0]]), be.asarray(state[keys[1]])
        be.adam(p, g, m, v, be.asarray(hyper), wd_flag)
        be.to_host(m, state[keys[0]])
        be.to_host(v, state[keys[1]])
        state[keys[2]][()] = F32(t)


def _check_state(key: str, value: Any, shape: tuple[int, ...]) -> None:
    ok = isinstance(value, np.ndarray) and value.dtype == np.float32 and value.shape == shape
    if not ok or not value.flags.c_contiguous or not value.flags.writeable:
        raise FormatError(f"exact mode: state {key} must be a writable float32 {shape} array")


def parse_optimizer(spec: dict[str, Any]) -> Optimizer:
    """Parse ``{"name": "sgd" | "adam", ...}`` (torch field names).

    Raises:
        FormatError: unknown name, missing or invalid field.
    """
    name = spec.get("name")
    wd = _hyper(spec, "weight_decay", 0.0)
    if name == "sgd":
        for key in ("dampening",):
            if spec.get(key, 0) != 0:
                raise FormatError(f"exact mode: sgd {key} is not supported")
        if spec.get("nesterov", False):
            raise FormatError("exact mode: sgd nesterov is not supported")
        return Optimizer("sgd", _hyper(spec, "lr"), _hyper(spec, "momentum", 0.0), wd)
    if name == "adam":
        betas = spec.get("betas", [0.9, 0.999])
        if not isinstance(betas, list | tuple) or len(betas) != 2:
            raise FormatError("exact mode: optimizer.betas must be [beta1, beta2]")
        b1 = _hyper({"beta1": betas[0]}, "beta1")
        b2 = _hyper({"beta2": betas[1]}, "beta2")
        if not (b1 < 1 and b2 < 1):
            raise FormatError("exact mode: optimizer.betas must lie in [0, 1)")
        eps = _hyper(spec, "eps", 1e-8)
        return Optimizer("adam", _hyper(spec, "lr"), 0.0, wd, b1, b2, eps)
    raise FormatError(f"exact mode: optimizer {name!r} is not supported (sgd, adam)")
