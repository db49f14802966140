"""Check ``vectors/rounding/``: rounding-log bytes, commitment and one-site replays (SPEC VI).

``log.json``: valid cases must encode to ``blob`` and decode back, with ``digest``; invalid
blobs must be refused with their reason
(``ROUNDING_LOG_MALFORMED`` by the decoder, ``ROUNDING_LOG_MISMATCH`` by the binding check).
``replay.json``: following ``log`` on the site ``values`` (with its ``bound``, ``K`` and ``S``,
where the case has one: SPEC VI §2) must give ``rounded`` (valid) or fail with
``expected_reason``. ``bundle/cases.json``: rounded-backend bundles (honest and forged)
verified as ``vectors/bundle`` cases are, with their verdict, first reason and report digest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dk.errors import FormatError
from dk.vectors import CaseResult, run_cases

AREA = "rounding"
MAX_HEX = 1 << 20


def _bytes(h: str) -> bytes:
    if len(h) > 2 * MAX_HEX:
        raise ValueError("hex field too large")
    return bytes.fromhex(h)


def _check_log(case: dict[str, Any]) -> str:
    from dk.pol.backends.log import RoundingLog, check_binding, decode_log, log_digest

    blob = _bytes(case["blob"])
    if case["result"] == "valid":
        d = case["log"]
        log = RoundingLog(bytes.fromhex(d["job_id"]), d["interval"], d["tau_log2"], d["sites"],
                          bytes.fromhex(d["trace"]), [tuple(e) for e in d["entries"]])  # fmt: skip
        if log.encode() != blob:
            return "encoding differs"
        if decode_log(blob) != log:
            return "decoding differs"
        return "" if log_digest(blob).hex() == case["digest"] else "digest differs"
    try:
        log = decode_log(blob)
        if "expect" in case:
            x = case["expect"]
            check_binding(log, job_id=bytes.fromhex(x["job_id"]), interval=x["interval"],
                          tau_log2=x["tau_log2"])  # fmt: skip
    except FormatError as e:
        return "" if e.reason == case["expected_reason"] else f"refused with {e.reason}"
    return "invalid log accepted"


def _check_replay(case: dict[str, Any]) -> str:
    import numpy as np
    import torch

    from dk.pol.backends.log import decode_log
    from dk.pol.backends.rounded import RoundedMode

    v = np.frombuffer(_bytes(case["values"]), dtype="<f8").astype(np.float64)
    bound = None
    if "bound" in case:  # a bounded site (SPEC VI §2): K terms, S per element
        from dk.pol.backends.bounds import Bound

        s = np.frombuffer(_bytes(case["bound"]["s"]), dtype="<f8").astype(np.float64)
        if s.size != v.size:
            return "bound has another element count than values"
        k_sum = case["bound"].get("k_sum")  # a blocked sum's K' (SPEC VI §2); default K
        bound = Bound.given(int(case["bound"]["k"]), s, None if k_sum is None else int(k_sum))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(case.get("dtype", "float32"))
    if dtype is None:
        return f"unknown site dtype {case.get('dtype')!r}"
    try:
        mode = RoundedMode.replay(decode_log(_bytes(case["log"])))
        site = mode.round_site(torch.from_numpy(v.copy()), case["name"], bound, dtype=dtype)
        r = site.float().numpy()  # a bfloat16 site's values as float32 (exact)
        mode.finish()
    except FormatError as e:
        if case["result"] == "valid":
            return f"valid log refused: {e.reason}"
        return "" if e.reason == case["expected_reason"] else f"refused with {e.reason}"
    if case["result"] == "invalid":
        return "invalid log accepted"
    got = r.astype("<f4").tobytes().hex()
    return "" if got == case["rounded"] else f"rounded {got} differs"


def block_counts(op: str, a: dict[str, Any]) -> tuple[list[int | None], list[int | None]]:
    """``(K, K')`` of each output of a ``convolution`` or ``convolution_backward`` call with
    the shapes and parameters ``a`` (SPEC VI §1), on meta tensors (no data)."""
    import torch

    from dk.pol.backends.blocked import block_terms
    from dk.pol.backends.bounds import _term_counts

    def t(shape: list[int]) -> Any:
        return torch.empty(shape, device="meta")

    x, w = t(a["x"]), t(a["w"])
    params = [a["stride"], a["padding"], a["dilation"], a["transposed"], a["output_padding"]]
    if op == "convolution":
        bias = t([a["w"][1] * a["groups"] if a["transposed"] else a["w"][0]]) if a["bias"] else None
        args: tuple[Any, ...] = (x, w, bias, *params, a["groups"])
        outs = [None]
    else:
        go = t(a["go"])
        args = (go, x, w, [a["go"][1]], *params, a["groups"], a["mask"])
        outs = [None, None, None]
    k = _term_counts(op, args, {}, outs)
    if op == "convolution_backward":
        k = [kk if m else None for kk, m in zip(k, a["mask"], strict=True)]
    return k, block_terms(op, args, k)


def _check_blocks(case: dict[str, Any]) -> str:
    k, k_sum = block_counts(case["op"], case["args"])
    if k != case["k"]:
        return f"K {k} differs from {case['k']}"
    return "" if k_sum == case["k_sum"] else f"K' {k_sum} differs from {case['k_sum']}"


def check(root: Path) -> list[CaseResult]:
    """Re-derive every case under ``root/rounding/``.

    Args:
        root: the ``vectors/`` directory.

    Returns:
        One :class:`CaseResult` per case.
    """
    results = run_cases(
        root,
        AREA,
        {"log.json": _check_log, "replay.json": _check_replay, "blocks.json": _check_blocks},
    )
    return results + check_bundles(root)


def check_bundles(root: Path) -> list[CaseResult]:
    """Verify every case of ``root/rounding/bundle/cases.json`` (SPEC VI §5), one thread."""
    import torch

    from dk.vectors import load_cases
    from dk.vectors.bundle import run_case

    base = root / AREA / "bundle"
    if not (base / "cases.json").is_file():
        return []
    results: list[CaseResult] = []
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for c in load_cases(base / "cases.json")["cases"]:
            try:
                msg = run_case(root, c, base=base)
            except Exception as e:  # a broken case is a failed case, never a crash
                msg = f"{type(e).__name__}: {e}"
            results.append(CaseResult(AREA, "bundle/cases.json", int(c["tcId"]), not msg, msg))
    finally:
        torch.set_num_threads(old)
    return results
