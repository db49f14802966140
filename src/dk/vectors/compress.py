"""Check ``vectors/compress/`` with the library (SPEC.md Part III)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dk.compress import decode, encode, parse_codec
from dk.compress.reference import rng_reference
from dk.errors import FormatError
from dk.vectors import CaseResult, run_cases

AREA = "compress"


def _codec_case(case: dict[str, Any]) -> str:
    shape = tuple(case["shape"])
    x = np.frombuffer(bytes.fromhex(case["input"]), "<f4").astype(np.float32).reshape(shape)
    for backend in ("numpy", "numba"):
        codec = parse_codec(case["spec"], backend=backend)
        data = encode(codec.compress(x, counter=case["counter"]))
        if data.hex() != case["msg"]:
            return f"{backend} encoding differs"
        dec = np.empty(shape, np.float32)
        codec.decompress(decode(data), dec)
        if dec.astype("<f4").tobytes().hex() != case["decompressed"]:
            return f"{backend} decompression differs"
    return ""


def _wire_case(case: dict[str, Any]) -> str:
    try:
        decode(bytes.fromhex(case["msg"]))
    except FormatError as e:
        if e.reason != case["expected_reason"]:
            return f"rejected with {e.reason}, expected {case['expected_reason']}"
        return ""
    return "accepted an invalid message"


def _rng_case(case: dict[str, Any]) -> str:
    z = np.zeros(len(case["outputs"]), np.uint64)
    rng_reference(int(case["seed"]), int(case["counter"]), z)
    return "" if [f"{int(v):016x}" for v in z] == case["outputs"] else "outputs differ"


_CHECKS = {"codecs.json": _codec_case, "wire_invalid.json": _wire_case, "rng.json": _rng_case}


def check(root: Path) -> list[CaseResult]:
    """Re-derive every case under ``root/compress/``.

    Args:
        root: the ``vectors/`` directory.

    Returns:
        One :class:`CaseResult` per case.
    """
    return run_cases(root, AREA, _CHECKS)
