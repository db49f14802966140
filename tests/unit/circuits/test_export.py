"""The exported ONNX step: explicit backward, names, and agreement with the float step."""

from __future__ import annotations

import numpy as np
import pytest

from dk.circuits.export import (
    build_step_graph,
    check_export,
    input_names,
    output_names,
    run_step_graph,
)
from dk.circuits.spec import StepSpec, batch_arrays, reference_step
from dk.errors import FormatError

pytest.importorskip("onnxruntime")

CASES = [
    ({"arch": "linear", "input_dim": 4, "output_dim": 2}, "mse"),
    ({"arch": "linear", "input_dim": 64, "output_dim": 10}, "cross_entropy"),
    ({"arch": "mlp", "input_dim": 64, "hidden": [16], "output_dim": 10}, "cross_entropy"),
    ({"arch": "mlp", "input_dim": 5, "hidden": [7, 3], "output_dim": 4}, "mse"),
]


def _inputs(spec: StepSpec, seed: int) -> tuple[dict, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    params = {
        k: rng.normal(size=s).astype(np.float32) * 0.3 for k, s in spec.param_shapes().items()
    }
    y = (
        rng.integers(0, spec.output_dim, spec.batch_size)
        if spec.loss == "cross_entropy"
        else rng.normal(size=(spec.batch_size, spec.output_dim))
    )
    x, t = batch_arrays(spec, rng.normal(size=(spec.batch_size, spec.input_dim)), y)
    return params, x, t


@pytest.mark.parametrize(("model", "loss"), CASES)
def test_graph_matches_float_step(model: dict, loss: str) -> None:
    spec = StepSpec.from_model(model, loss=loss, lr=0.05, batch_size=8)
    graph = build_step_graph(spec).SerializeToString()
    for seed in range(3):
        params, x, t = _inputs(spec, seed)
        assert check_export(graph, spec, params, x, t) < 1e-4
        got = run_step_graph(graph, spec, params, x, t)
        want = reference_step(spec, params, x, t)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6)


def test_graph_interface_and_explicit_backward() -> None:
    spec = StepSpec.from_model(
        {"arch": "mlp", "input_dim": 3, "hidden": [2], "output_dim": 2},
        loss="cross_entropy",
        lr=0.1,
        batch_size=2,
    )
    model = build_step_graph(spec)
    assert [i.name for i in model.graph.input] == input_names(spec)
    assert input_names(spec) == ["fc0.bias", "fc0.weight", "fc1.bias", "fc1.weight", "x", "y"]
    assert [o.name for o in model.graph.output] == output_names(spec)
    ops = {n.op_type for n in model.graph.node}
    # Gradients are spelled out: transposed matmuls for weight gradients, a reduction for
    # bias gradients and a ReLU mask; no training or gradient operators.
    assert {"MatMul", "Transpose", "ReduceSum", "Sign", "Softmax", "Sub", "Mul"} <= ops
    assert not {op for op in ops if "Grad" in op or op in ("Gradient", "Momentum")}


def test_check_export_detects_a_wrong_graph() -> None:
    spec = StepSpec.from_model(
        {"arch": "linear", "input_dim": 4, "output_dim": 2}, loss="mse", lr=0.1, batch_size=2
    )
    other = StepSpec.from_model(
        {"arch": "linear", "input_dim": 4, "output_dim": 2}, loss="mse", lr=0.2, batch_size=2
    )
    params, x, t = _inputs(spec, 0)
    with pytest.raises(FormatError, match="differs from the float step"):
        check_export(build_step_graph(other).SerializeToString(), spec, params, x, t)
