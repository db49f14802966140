"""Check ``vectors/circuits/proofs.json``: proof records of the tiny circuit (SPEC IV §3.4-§6).

The file names the circuit (linear 4->2, MSE, batch 2, lr 0.1, ``decomp_base`` 256,
``decomp_legs`` 4), the checked-in local SRS it was proven with (pinned by SHA-256), the
committed checkpoints and batches (float32, little-endian hex) and a pool of proof records.
The checker builds its own circuit from that description in a temporary work directory, as a
verifier on a fresh machine would, and judges every case with ``verify_interval`` /
``verify_step`` (or, for the trajectory cases, ``step`` / ``prove_interval``). EZKL is
required; without it every case fails with a message saying so.

A record entry in a case is a pool name, ``{"record": name, "replace": {...}, "remove":
[...], "repeat": {field: [unit, count]}}`` (top-level fields changed; ``repeat`` keeps
oversized values out of the file), or ``{"literal": value}`` (any JSON value).
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dk.vectors import CaseResult, load_cases

AREA = "circuits"
FILE = "proofs.json"
#: Bound on a ``repeat`` recipe (a field made of ``count`` copies of a short string).
MAX_REPEAT = 1 << 23


@dataclass
class ProofContext:
    """What every case of ``proofs.json`` needs: the circuit and the decoded tensors."""

    doc: dict[str, Any]
    circ: Any
    workdir: Path
    srs_path: Path
    checkpoints: dict[str, dict[str, np.ndarray]]
    batches: dict[str, tuple[np.ndarray, np.ndarray]]


def build_circuit(
    circuit: Mapping[str, Any], workdir: Path, srs: Path | None, sha256: str | None, kind: str
) -> Any:
    """Build the step circuit a vector file describes (``srs=None``: a fresh local SRS)."""
    from dk.circuits import StepCircuit, ZkSettings

    return StepCircuit.build(
        model=circuit["model"],
        loss=circuit["loss"],
        lr=circuit["lr"],
        batch_size=circuit["batch_size"],
        workdir=workdir,
        srs=srs,
        srs_sha256=sha256,
        srs_kind=kind,
        settings=ZkSettings(**circuit["settings"]),
    )


def resolve(pool: Mapping[str, Any], entry: Any) -> Any:
    """The record (or raw value) a case entry stands for."""
    if isinstance(entry, str):
        return copy.deepcopy(pool[entry])
    if "literal" in entry:
        return copy.deepcopy(entry["literal"])
    record = copy.deepcopy(pool[entry["record"]])
    record.update(copy.deepcopy(entry.get("replace", {})))
    for key, (unit, count) in entry.get("repeat", {}).items():
        record[key] = unit * min(int(count), MAX_REPEAT)
    for key in entry.get("remove", []):
        record.pop(key)
    return record


def _proofs(ctx: ProofContext, entries: Any) -> Any:
    pool = ctx.doc["records"]
    if isinstance(entries, list):
        return [resolve(pool, e) for e in entries]
    return resolve(pool, entries)


def _digest(ctx: ProofContext, name: str | None) -> str | None:
    return None if name is None else _digest_of(ctx, name)


def _digest_of(ctx: ProofContext, name: str) -> str:
    return ctx.circ.params_digest(ctx.checkpoints[name])


def _judge(case: Mapping[str, Any], res: Any) -> str:
    """Compare a ``VerifyResult`` with the case's expectation."""
    if case["result"] == "valid":
        if not res.ok:
            return f"rejected: {res.reason.value} ({res.detail})"
        return "" if list(res.flags) == case["flags"] else f"flags {list(res.flags)}"
    if res.ok:
        return "accepted an invalid proof"
    if res.reason.value != case["expected_reason"]:
        return (
            f"rejected with {res.reason.value} ({res.detail}), expected {case['expected_reason']}"
        )
    if "step" in case and res.step != case["step"]:
        return f"rejected at step {res.step}, expected {case['step']}"
    return ""


def _interval(ctx: ProofContext, case: Mapping[str, Any]) -> str:
    from dk.circuits import verify_interval

    res = verify_interval(
        ctx.circ,
        _proofs(ctx, case["proofs"]),
        _digest_of(ctx, case["start"]),
        _digest_of(ctx, case["end"]),
        [ctx.batches[b] for b in case["batches"]],
    )
    return _judge(case, res)


def _step(ctx: ProofContext, case: Mapping[str, Any], circ: Any = None) -> str:
    from dk.circuits import verify_step

    batch = case.get("batch")
    res = verify_step(
        circ or ctx.circ,
        _proofs(ctx, case["proof"]),
        params_in=_digest(ctx, case.get("params_in")),
        batch=None if batch is None else ctx.circ.batch_digest(*ctx.batches[batch]),
        params_out=_digest(ctx, case.get("params_out")),
    )
    return _judge(case, res)


def _trajectory(ctx: ProofContext, case: Mapping[str, Any]) -> str:
    """SPEC IV §3.4: the committed checkpoint is the circuit's step; the prover refuses others."""
    from dk.circuits import CircuitError, prove_interval

    names = case["checkpoints"]
    params = [ctx.checkpoints[n] for n in names]
    batches = [ctx.batches[b] for b in case["batches"]]
    if case["result"] == "valid":
        out = ctx.circ.step(params[0], *batches[0])
        same = all(
            np.array_equal(out[k].view(np.uint32), params[1][k].view(np.uint32)) for k in out
        )
        return "" if same else f"the circuit's step from {names[0]} is not {names[1]}"
    try:
        prove_interval(ctx.circ, params, batches)
    except CircuitError as e:
        return "" if e.reason == case["expected_reason"] else f"refused with {e.reason}"
    return "proved a trajectory that is not the circuit's"


def _srs(ctx: ProofContext, case: Mapping[str, Any]) -> str:
    """SPEC IV §5: a supplied SRS is pinned; a ceremony SRS is trusted (no flag)."""
    from dk.circuits import CircuitError

    doc = ctx.doc
    try:
        circ = build_circuit(
            doc["circuit"],
            ctx.workdir,
            ctx.srs_path,
            case.get("srs_sha256", doc["srs"]["sha256"]),
            case["srs_kind"],
        )
    except CircuitError as e:
        if case["result"] == "invalid":
            return "" if e.reason == case["expected_reason"] else f"refused with {e.reason}"
        return f"refused: {e}"
    if case["result"] == "invalid":
        return "accepted an SRS whose SHA-256 is not the pin"
    return _step(ctx, case, circ)


_KINDS = {"interval": _interval, "step": _step, "trajectory": _trajectory, "srs": _srs}


def _context(root: Path, doc: dict[str, Any], workdir: Path) -> ProofContext:
    from dk.vectors.circuits import tensors_from_json

    srs_path = root / doc["srs"]["file"]
    circ = build_circuit(doc["circuit"], workdir, srs_path, doc["srs"]["sha256"], "local")
    return ProofContext(
        doc=doc,
        circ=circ,
        workdir=workdir,
        srs_path=srs_path,
        checkpoints={k: tensors_from_json(v) for k, v in doc["checkpoints"].items()},
        batches={
            k: (tensors_from_json(v)["x"], tensors_from_json(v)["y"])
            for k, v in doc["batches"].items()
        },
    )


def _all_fail(cases: list[dict[str, Any]], message: str) -> list[CaseResult]:
    return [CaseResult(AREA, FILE, c["tcId"], False, message) for c in cases]


def check_proofs(area_dir: Path) -> list[CaseResult]:
    """Check every case of ``area_dir/proofs.json`` in a temporary work directory.

    Returns:
        One :class:`CaseResult` per case. Without EZKL, or when this EZKL/ONNX builds another
        circuit than the one the records were made for, every case fails with the reason.
    """
    path = area_dir / FILE
    if not path.exists():
        return [CaseResult(AREA, FILE, 0, False, "file missing")]
    doc = load_cases(path)
    cases = doc["cases"]
    try:
        import ezkl
    except ImportError:
        return _all_fail(cases, "needs ezkl (pip install 'dk-pol[zk]'); proofs not checked")
    results = []
    with tempfile.TemporaryDirectory(prefix="dk-vectors-") as tmp:
        try:
            ctx = _context(area_dir, doc, Path(tmp))
        except Exception as e:
            return _all_fail(cases, f"cannot build the circuit: {type(e).__name__}: {e}")
        if ctx.circ.circuit_id != doc["circuit_id"]:
            version = ezkl.__version__  # type: ignore[attr-defined]  # ezkl's .pyi omits it
            return _all_fail(
                cases,
                f"this ezkl {version} builds circuit {ctx.circ.circuit_id[:16]}..., "
                f"the records are for {doc['circuit_id'][:16]}... (ezkl {doc['ezkl_version']}); "
                "regenerate with python -m vectors.gen circuits",
            )
        for case in cases:
            try:
                message = _KINDS[case["check"]](ctx, case)
            except Exception as e:  # a crash on one case is a failed case, not an abort
                message = f"{type(e).__name__}: {e}"
            results.append(CaseResult(AREA, FILE, case["tcId"], not message, message))
    return results
