"""Export one SGD step as an ONNX graph with an explicit backward (SPEC IV §2).

Graph inputs, in this order: every parameter in sorted-name order, then ``x`` (``[B, in]``)
and ``y`` (``[B, out]``, one-hot for class labels). Graph outputs: the new parameters in the
same sorted-name order, named ``next/<name>``. The backward is written out op by op (no
autograd); :func:`check_export` runs the graph with onnxruntime and compares it with
:func:`dk.circuits.spec.reference_step` before a circuit is built from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dk.circuits.spec import SOFTMAX_CLAMP, StepSpec, reference_step
from dk.errors import BackendUnavailable, FormatError

OPSET = 13
IR_VERSION = 8
OUTPUT_PREFIX = "next/"
#: float32 step vs float64 reference: allowed |difference| relative to the largest update.
EXPORT_RTOL = 1e-4


def _onnx():  # type: ignore[no-untyped-def]
    try:
        import onnx
    except ImportError as e:  # pragma: no cover - exercised only without the zk extra
        raise BackendUnavailable("the ONNX export needs onnx: pip install 'dk-pol[zk]'") from e
    return onnx


def input_names(spec: StepSpec) -> list[str]:
    """Graph input names: parameters (sorted), then ``x`` and ``y``."""
    return [*spec.param_shapes(), "x", "y"]


def output_names(spec: StepSpec) -> list[str]:
    """Graph output names: ``next/<param>`` in sorted parameter order."""
    return [OUTPUT_PREFIX + name for name in spec.param_shapes()]


def build_step_graph(spec: StepSpec):  # type: ignore[no-untyped-def]
    """Build the ONNX model of one SGD step of ``spec``.

    Args:
        spec: the model, loss, learning rate and batch size.

    Returns:
        An ``onnx.ModelProto`` (opset 13, IR version 8), checked by ``onnx.checker``.

    Raises:
        BackendUnavailable: when onnx is not installed.
    """
    onnx = _onnx()
    from onnx import TensorProto, helper, numpy_helper

    n = len(spec.layer_dims)
    nodes = []
    inits = [
        numpy_helper.from_array(np.array([0], dtype=np.int64), "axes0"),
        numpy_helper.from_array(np.array(spec.lr, dtype=np.float32), "lr"),
        numpy_helper.from_array(np.array(-SOFTMAX_CLAMP, dtype=np.float32), "clamp_lo"),
    ]

    def node(op: str, ins: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    # Forward: z_i = h_i @ W_i^T + b_i ; h_{i+1} = relu(z_i).
    h = "x"
    acts, pre = [h], []
    for i in range(n):
        wt = node("Transpose", [f"fc{i}.weight"], f"wt{i}", perm=[1, 0])
        z = node("Add", [node("MatMul", [h, wt], f"xw{i}"), f"fc{i}.bias"], f"z{i}")
        pre.append(z)
        if i < n - 1:
            h = node("Relu", [z], f"h{i + 1}")
            acts.append(h)

    # Loss gradient with respect to the last pre-activation.
    if spec.loss == "mse":
        coef = 2.0 / (spec.batch_size * spec.output_dim)
        diff = node("Sub", [pre[-1], "y"], "diff")
    else:
        coef = 1.0 / spec.batch_size
        top = node("ReduceMax", [pre[-1]], "zmax", axes=[1], keepdims=1)
        shifted = node("Sub", [pre[-1], top], "zshift")
        clamped = node("Clip", [shifted, "clamp_lo"], "zclamp")  # SPEC IV §2.2
        prob = node("Softmax", [clamped], "prob", axis=1)
        diff = node("Sub", [prob, "y"], "diff")
    inits.append(numpy_helper.from_array(np.array(coef, dtype=np.float32), "loss_coef"))
    dz = node("Mul", [diff, "loss_coef"], f"dz{n - 1}")

    # Backward and update, last layer first.
    for i in reversed(range(n)):
        dzt = node("Transpose", [dz], f"dzt{i}", perm=[1, 0])
        gw = node("MatMul", [dzt, acts[i]], f"gw{i}")
        gb = node("ReduceSum", [dz, "axes0"], f"gb{i}", keepdims=0)
        for kind, grad in (("weight", gw), ("bias", gb)):
            step = node("Mul", [grad, "lr"], f"step_{kind}{i}")
            node("Sub", [f"fc{i}.{kind}", step], f"{OUTPUT_PREFIX}fc{i}.{kind}")
        if i > 0:
            dh = node("MatMul", [dz, f"fc{i}.weight"], f"dh{i}")
            mask = node("Sign", [acts[i]], f"mask{i}")  # relu'(z) = sign(relu(z)) in {0, 1}
            dz = node("Mul", [dh, mask], f"dz{i - 1}")

    shapes = spec.param_shapes()
    inputs = [
        helper.make_tensor_value_info(k, TensorProto.FLOAT, list(s)) for k, s in shapes.items()
    ]
    inputs += [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [spec.batch_size, spec.input_dim]),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [spec.batch_size, spec.output_dim]),
    ]
    outputs = [
        helper.make_tensor_value_info(OUTPUT_PREFIX + k, TensorProto.FLOAT, list(s))
        for k, s in shapes.items()
    ]
    graph = helper.make_graph(nodes, f"dk_sgd_step_{spec.arch}", inputs, outputs, inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="dk.circuits",
    )
    onnx.checker.check_model(model)
    return model


def run_step_graph(
    model_bytes: bytes,
    spec: StepSpec,
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    targets: np.ndarray,
) -> dict[str, np.ndarray]:
    """Run the exported step in float32 with onnxruntime; return the new parameters by name."""
    try:
        import onnxruntime as ort
    except ImportError as e:  # pragma: no cover
        raise BackendUnavailable("checking the export needs onnxruntime") from e
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])
    feed = {k: np.asarray(params[k], np.float32) for k in spec.param_shapes()}
    feed["x"] = np.asarray(x, np.float32)
    feed["y"] = np.asarray(targets, np.float32)
    outs = sess.run(output_names(spec), feed)
    return {k: v for k, v in zip(spec.param_shapes(), outs, strict=True)}


def check_export(
    model_bytes: bytes,
    spec: StepSpec,
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    targets: np.ndarray,
) -> float:
    """Compare the ONNX step with the float64 reference step on one input.

    Returns:
        The largest |difference| divided by the largest |update| of the reference step.

    Raises:
        FormatError: when the relative difference exceeds :data:`EXPORT_RTOL`.
    """
    got = run_step_graph(model_bytes, spec, params, x, targets)
    want = reference_step(spec, params, x, targets)
    update = max(float(np.max(np.abs(want[k] - params[k]))) for k in want)
    err = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
    rel = err / max(update, 1e-12)
    if rel > EXPORT_RTOL and err > 1e-6:
        raise FormatError(
            f"circuit: exported step differs from the float step by {err:.3g} "
            f"({rel:.3g} of the update)"
        )
    return rel
