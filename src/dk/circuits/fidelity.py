"""Holding a circuit to the float step: the output bound and the calibration input.

SPEC IV §4.3. The bound is ``bound_ulps * 2**-s + bound_rel * max|float update|``: a
few units in the last place for rounding, plus a small fraction of the update for the
quantised constants (``lr``, the loss coefficient) and the softmax clamp.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from dk.circuits.ezkl_backend import ZkSettings
from dk.circuits.reasons import CircuitError
from dk.circuits.spec import SOFTMAX_CLAMP, StepSpec, reference_step

TAG_CALIBRATION = "dk/v1/circuits/calibration"


@dataclass(frozen=True)
class Fidelity:
    """Largest |decoded circuit output - float step| and the bound it was held to."""

    max_error: float
    bound: float


def check_bound(
    spec: StepSpec,
    zs: ZkSettings,
    params_q: Mapping[str, np.ndarray],
    x_q: np.ndarray,
    y_q: np.ndarray,
    out_q: Mapping[str, np.ndarray],
) -> Fidelity:
    """Hold decoded circuit outputs to the documented bound of the float step (SPEC §4.3).

    The bound is ``bound_ulps * 2**-s + bound_rel * max|float update|``, where the float step
    runs in float64 on the dequantised inputs the circuit saw.

    Raises:
        CircuitError: when any output element is farther from the float step than the bound.
    """
    s = zs.scale
    p = {k: np.ldexp(v.astype(np.float64), -s) for k, v in params_q.items()}
    ref = reference_step(
        spec, p, np.ldexp(x_q.astype(np.float64), -s), np.ldexp(y_q.astype(np.float64), -s)
    )
    update = max(float(np.max(np.abs(ref[k] - p[k]))) for k in ref)
    err = max(
        float(np.max(np.abs(np.ldexp(out_q[k].astype(np.float64), -s) - ref[k]))) for k in ref
    )
    bound = zs.bound_ulps * 2.0**-s + zs.bound_rel * update
    if not err <= bound:
        raise CircuitError(
            f"circuit: decoded outputs differ from the float step by {err:.3g} > bound "
            f"{bound:.3g} (outside the documented bound)"
        )
    return Fidelity(max_error=err, bound=bound)


def calibration_batch(
    spec: StepSpec, seed: bytes
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Deterministic calibration input: torch-default-like init, x ~ U(0, 1), labels."""
    rng = np.random.default_rng(np.frombuffer(seed, dtype=np.uint32))
    params = {}
    for name, shape in spec.param_shapes().items():
        fan_in = spec.layer_dims[int(name[2:].split(".")[0])][0]
        params[name] = rng.uniform(-1, 1, size=shape).astype(np.float32) / np.sqrt(fan_in)
    x = rng.uniform(0, 1, size=(spec.batch_size, spec.input_dim)).astype(np.float32)
    y = rng.integers(0, spec.output_dim, size=spec.batch_size)
    if spec.loss == "cross_entropy":
        # Spread the logits past the softmax clamp so calibration sizes the exp table for
        # the whole clamped range [-SOFTMAX_CLAMP, 0], not just what this batch happens to hit.
        last = f"fc{len(spec.layer_dims) - 1}.bias"
        params[last] = np.linspace(
            -2 * SOFTMAX_CLAMP, 2 * SOFTMAX_CLAMP, spec.output_dim, dtype=np.float32
        )
    return params, x, y
