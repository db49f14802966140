"""Check ``vectors/exact/``: exact-mode replays must reproduce the committed root bit for bit.

Each case gives a registry model, optimizer and loss, a start checkpoint (the registry
initialisation for ``init_seed``, whose root is listed), a list of batches (float32 ``x`` as
little-endian hex, int64 labels) and the root expected after one exact step per batch. The root
is ``checkpoint_root`` over the ``model/<param>`` and ``optim/<state key>`` tensors (SPEC II
§5 names). Valid cases must match; invalid ones (a root whose checkpoint differs by one ulp in
one weight) must not, with reason ``REPLAY_MISMATCH``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dk.vectors import CaseResult, run_cases

AREA = "exact"
FILE = "replay.json"
MAX_X_BYTES = 1 << 20


def replay_root(case: dict[str, Any]) -> tuple[bytes, bytes]:
    """(start root, end root) of a case's replay on the exact CPU kernels."""
    from dk.pol.checkpoint import checkpoint_root
    from dk.pol.exact import ExactTrainer
    from dk.pol.models import init_params

    tr = ExactTrainer(case["model"], case["optimizer"], case["loss"])
    params = init_params(case["model"], int(case["init_seed"]))
    state: dict[str, Any] = {}
    start = checkpoint_root(exact_tensors(params, state))
    for b in case["batches"]:
        raw = bytes.fromhex(b["x"])
        if len(raw) > MAX_X_BYTES:
            raise ValueError("batch too large")
        x = np.frombuffer(raw, dtype="<f4").reshape(b["shape"]).copy()
        tr.step(params, state, x, np.asarray(b["y"], dtype=np.int64))
    return start, checkpoint_root(exact_tensors(params, state))


def exact_tensors(params: dict[str, np.ndarray], state: dict[str, np.ndarray]) -> dict:
    """The checkpoint tensors of an exact-mode training state."""
    return {**{f"model/{k}": v for k, v in params.items()},
            **{f"optim/{k}": v for k, v in state.items()}}  # fmt: skip


def _check_case(case: dict[str, Any]) -> str:
    start, end = replay_root(case)
    if start.hex() != case["start_root"]:
        return "start root differs"
    match = end.hex() == case["expected_root"]
    if case["result"] == "valid":
        return "" if match else f"replayed root {end.hex()} differs"
    if match:
        return "invalid case replayed to its root"
    return "" if case.get("expected_reason") == "REPLAY_MISMATCH" else "wrong expected_reason"


def _check_elementwise(case: dict[str, Any]) -> str:
    """``exp32`` / ``log32`` / ``erf32`` of the compiled CPU kernels on ``x``, bit for bit."""
    from dk.pol.exact import _cpu

    fn = {"exp32": _cpu.exp32, "log32": _cpu.log32, "erf32": _cpu.erf32}[case["function"]]
    xs = np.frombuffer(bytes.fromhex(case["x"]), dtype="<f4")
    want = bytes.fromhex(case["y"])
    got = np.array([fn(np.float32(x)) for x in xs], dtype="<f4").tobytes()
    if len(want) != len(got):
        return "x and y differ in length"
    if case["result"] == "valid":
        bad = [i for i in range(len(xs)) if got[4 * i : 4 * i + 4] != want[4 * i : 4 * i + 4]]
        return f"{case['function']} differs at inputs {bad[:5]}" if bad else ""
    if got == want:
        return "invalid case reproduced"
    return "" if case.get("expected_reason") == "REPLAY_MISMATCH" else "wrong expected_reason"


def check(root: Path) -> list[CaseResult]:
    """Re-derive every case under ``root/exact/``.

    Args:
        root: the ``vectors/`` directory.

    Returns:
        One :class:`CaseResult` per case.
    """
    return run_cases(root, AREA, {FILE: _check_case, "elementwise.json": _check_elementwise})
