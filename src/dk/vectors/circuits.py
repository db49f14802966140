"""Check ``vectors/circuits/`` with the library (SPEC.md Part IV).

``quantize.json``, ``felt.json`` and ``digest.json`` need NumPy only, except the Poseidon
digest cases (``"requires": "ezkl"``). ``proofs.json`` needs EZKL: it is checked by
:mod:`dk.vectors.circuit_proofs`, which builds the circuit in a temporary directory with the
checked-in SRS and verifies the checked-in proof records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dk.errors import FormatError
from dk.vectors import CaseResult, run_cases

AREA = "circuits"
NEEDS_EZKL = "needs ezkl (pip install 'dk-pol[zk]'); not checked"


def tensors_to_json(tensors: Mapping[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """Named float32 tensors as ``{name: {"shape", "data": little-endian hex}}``."""
    return {
        k: {"shape": list(np.shape(v)), "data": np.asarray(v, "<f4").tobytes().hex()}
        for k, v in tensors.items()
    }


def tensors_from_json(doc: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Inverse of :func:`tensors_to_json`."""
    return {
        k: np.frombuffer(bytes.fromhex(t["data"]), "<f4").astype(np.float32).reshape(t["shape"])
        for k, t in doc.items()
    }


def set_digests(
    tensors: Mapping[str, np.ndarray], scale: int, kind: str
) -> tuple[dict[str, str], str]:
    """Per-tensor digests and the set digest (SPEC IV §3.3)."""
    from dk.circuits.quantize import tensor_digest, tensor_digests

    if not tensors:  # the per-tensor map of an empty set is empty; the set digest refuses
        return {}, tensor_digest(tensors, scale, kind)
    return tensor_digests(tensors, scale, kind), tensor_digest(tensors, scale, kind)


def batch_case_digest(case: Mapping[str, Any]) -> str:
    """The batch digest of a ``batch`` case: ``{"x", "y"}`` with labels one-hot encoded."""
    from dk.circuits.quantize import tensor_digest
    from dk.circuits.spec import StepSpec, batch_arrays

    spec = StepSpec.from_model(
        case["model"], loss=case["loss"], lr=0.1, batch_size=case["batch_size"]
    )
    x = tensors_from_json({"x": case["x"]})["x"]
    y = case["y"]
    y_arr = np.asarray(y, np.int64) if isinstance(y, list) else tensors_from_json({"y": y})["y"]
    xs, ys = batch_arrays(spec, x, y_arr)
    return tensor_digest({"x": xs, "y": ys}, case["scale"], "sha256")


def _expect_format_error(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except FormatError:
        return ""
    return "accepted invalid input"


def _quantize_case(case: dict[str, Any]) -> str:
    from dk.circuits.quantize import dequantize, quantize

    x = np.frombuffer(bytes.fromhex(case["input"]), "<f4").reshape(case["shape"])
    if case["result"] == "invalid":
        return _expect_format_error(lambda: quantize(x, case["scale"]))
    q = quantize(x, case["scale"])
    if q.ravel().tolist() != case["q"]:
        return f"quantised to {q.ravel().tolist()}"
    deq = dequantize(q, case["scale"]).astype("<f4").tobytes().hex()
    return "" if deq == case["dequantized"] else "dequantised values differ"


def _felt_case(case: dict[str, Any]) -> str:
    from dk.circuits.quantize import felt_to_int, felts_to_array, int_to_felt

    op, valid = case["op"], case["result"] == "valid"
    if op == "encode":
        got = int_to_felt(int(case["int"]))
        return "" if (got == case["felt"]) == valid else f"encoded as {got}"
    if op == "decode":
        if not valid:
            return _expect_format_error(lambda: felt_to_int(case["felt"]))
        return "" if str(felt_to_int(case["felt"])) == case["int"] else "decoded value differs"
    if op == "decode_array":
        if not valid:
            return _expect_format_error(lambda: felts_to_array(case["felts"], case["shape"]))
        ints = felts_to_array(case["felts"], tuple(case["shape"])).ravel().tolist()
        return "" if ints == case["ints"] else f"decoded to {ints}"
    return f"unknown op {op!r}"


def _digest_case(case: dict[str, Any]) -> str:
    if case.get("requires") == "ezkl":
        try:
            import ezkl  # noqa: F401
        except ImportError:
            return NEEDS_EZKL
    if case["op"] == "batch":
        if case["result"] == "invalid":
            return _expect_format_error(lambda: batch_case_digest(case))
        return "" if batch_case_digest(case) == case["digest"] else "batch digest differs"
    tensors = tensors_from_json(case["tensors"])
    kind, scale = case["kind"], case["scale"]
    if case["result"] == "valid":
        per_tensor, digest = set_digests(tensors, scale, kind)
        if per_tensor != case["tensor_digests"]:
            return "tensor digests differ"
        return "" if digest == case["digest"] else "set digest differs"
    if case["expected_reason"] == "FormatError":
        return _expect_format_error(lambda: set_digests(tensors, scale, kind))
    _, digest = set_digests(tensors, scale, kind)
    return "reproduced a wrong digest" if digest == case["digest"] else ""


_CHECKS: dict[str, Callable[[dict[str, Any]], str]] = {
    "quantize.json": _quantize_case,
    "felt.json": _felt_case,
    "digest.json": _digest_case,
}


def check(root: Path) -> list[CaseResult]:
    """Re-derive every case under ``root/circuits/``.

    Args:
        root: the ``vectors/`` directory.

    Returns:
        One :class:`CaseResult` per case; without EZKL, the cases that need it fail with a
        message saying so.
    """
    from dk.vectors.circuit_proofs import check_proofs

    results = run_cases(root, AREA, _CHECKS, checked_elsewhere=("proofs.json",))
    return results + check_proofs(Path(root) / AREA)
