"""Check ``vectors/fl/`` with the library (SPEC.md Part VII)."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dk.errors import FormatError
from dk.vectors import CaseResult, run_cases

AREA = "fl"


def _expect_error(fn: Any, case: dict[str, Any], kinds: tuple[type[Exception], ...]) -> str:
    try:
        fn()
    except kinds as e:
        reason = getattr(e, "reason", None) or type(e).__name__
        return "" if reason == case["expected_reason"] else f"raised {reason}"
    return "accepted an invalid case"


def _prg_case(case: dict[str, Any]) -> str:
    from dk.fl.secagg import prg_field

    if case["result"] == "invalid":
        return _expect_error(
            lambda: prg_field(bytes.fromhex(case["seed"]), case["n"]), case, (ValueError,)
        )
    got = prg_field(bytes.fromhex(case["seed"]), case["n"])
    return "" if [int(v) for v in got] == case["outputs"] else "outputs differ"


def _field_case(case: dict[str, Any]) -> str:
    from dk.fl.field import dequantize, quantize

    x = np.frombuffer(bytes.fromhex(case["x"]), "<f4")
    kw = {"scale": case["scale"], "clip": case["clip"], "n": case["n"]}
    if case["result"] == "invalid":
        return _expect_error(lambda: quantize(x, **kw), case, (ValueError,))
    for backend in ("reference", "numba"):
        q = quantize(x, backend=backend, **kw)
        if [int(v) for v in q] != case["q"]:
            return f"{backend} encoding differs"
        back = dequantize(q, scale=case["scale"], backend=backend)
        if back.astype("<f8").tobytes().hex() != case["decoded"]:
            return f"{backend} decoding differs"
    return ""


def _shamir_case(case: dict[str, Any]) -> str:
    from dk.fl.shamir import SecAggError, combine_shares

    shares = {int(k): bytes.fromhex(v) for k, v in case["shares"].items()}
    if case["result"] == "invalid":
        return _expect_error(lambda: combine_shares(shares, t=case["t"]), case, (SecAggError,))
    return "" if combine_shares(shares, t=case["t"]).hex() == case["secret"] else "wrong secret"


def _secagg_case(case: dict[str, Any]) -> str:
    from dk.fl.shamir import SecAggError

    def run() -> Any:
        return secagg_round(case)

    if case["result"] == "invalid":
        return _expect_error(run, case, (SecAggError,))
    total, survivors, masked = run()
    if sorted(survivors) != case["survivors"]:
        return "survivors differ"
    if [int(v) for v in total] != case["sum"]:
        return "sum differs"
    digest = hashlib.sha256(b"".join(masked[u].astype("<u8").tobytes() for u in sorted(masked)))
    return "" if digest.hexdigest() == case["masked_sha256"] else "masked inputs differ"


def secagg_round(case: dict[str, Any]) -> Any:
    """Re-run a vector's secure-aggregation round (its random bytes: ``default_rng(seed)``)."""
    from dk.fl.secagg import secure_sum

    rng = np.random.default_rng(case["rng_seed"])
    inputs = {int(u): np.array(v, dtype=np.uint64) for u, v in case["inputs"].items()}
    return secure_sum(
        inputs,
        n=case["n"],
        t=case["t"],
        session=bytes.fromhex(case["session"]),
        drop_before_input=case["drop_before_input"],
        drop_before_unmask=case["drop_before_unmask"],
        random_bytes=lambda k: rng.bytes(k),
    )


def _wire_case(case: dict[str, Any]) -> str:
    from dk.fl.wire import unpack_bundle

    data = bytes.fromhex(case["packed"])
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp) / "b"
        if case["result"] == "invalid":
            return _expect_error(lambda: unpack_bundle(data, dest), case, (FormatError,))
        unpack_bundle(data, dest)
        files = {
            p.relative_to(dest).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(dest.rglob("*"))
            if p.is_file()
        }
    return "" if files == case["files"] else "unpacked files differ"


def _job_case(case: dict[str, Any]) -> str:
    from dk.pol.job import parse_job

    if case["result"] == "invalid":
        return _expect_error(lambda: parse_job(case["toml"]), case, (FormatError,))
    return "" if parse_job(case["toml"]).job_id.hex() == case["job_id"] else "job_id differs"


_CHECKS = {
    "prg.json": _prg_case,
    "field.json": _field_case,
    "shamir.json": _shamir_case,
    "secagg.json": _secagg_case,
    "wire.json": _wire_case,
    "round_job.json": _job_case,
    "dp_job.json": _job_case,
}


def check(root: Path) -> list[CaseResult]:
    """Re-derive every case under ``root/fl/``.

    Args:
        root: the ``vectors/`` directory.

    Returns:
        One :class:`CaseResult` per case.
    """
    return run_cases(root, AREA, _CHECKS)
