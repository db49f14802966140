"""Canonical JSON (SPEC §1.3) and a strict, bounded JSON parser.

Canonical form: UTF-8, object keys sorted by their UTF-8 bytes, no insignificant whitespace,
``ensure_ascii=False``, integers in plain decimal, floats finite and written as Python's
shortest round-trip ``repr`` (for example ``0.05``, ``1e-08``), no NaN or infinities.
"""

from __future__ import annotations

import json
import math
from typing import Any

from dk.errors import FormatError

MAX_DEPTH = 32


def _check_text(s: str) -> None:
    # A JSON "\ud800" escape parses to a lone surrogate, which has no UTF-8 encoding.
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise FormatError("JSON strings must be valid Unicode (no lone surrogates)") from None


def _check(value: Any, depth: int = 0) -> None:
    if isinstance(value, dict | list | tuple) and depth >= MAX_DEPTH:
        raise FormatError(f"JSON nested deeper than {MAX_DEPTH}")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise FormatError("JSON object keys must be strings")
            _check_text(k)
            _check(v, depth + 1)
    elif isinstance(value, list | tuple):
        for v in value:
            _check(v, depth + 1)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise FormatError("JSON numbers must be finite")
    elif isinstance(value, str):
        _check_text(value)
    elif value is None or isinstance(value, bool | int):
        return
    else:
        raise FormatError(f"cannot encode {type(value).__name__} in canonical JSON")


def canonical_json(value: Any) -> bytes:
    """Encode ``value`` as canonical JSON bytes (SPEC §1.3)."""
    _check(value)
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise FormatError(f"duplicate JSON key {k!r}")
        out[k] = v
    return out


def _reject_constant(name: str) -> Any:
    raise FormatError(f"JSON constant {name} is not allowed")


def parse_json(data: bytes, *, limit: int, what: str = "JSON document") -> Any:
    """Parse untrusted JSON strictly: size limit, UTF-8, no duplicates, no NaN, bounded depth."""
    if len(data) > limit:
        raise FormatError(f"{what} is {len(data)} bytes, over the {limit}-byte limit")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError(f"{what} is not valid UTF-8") from None
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except FormatError:
        raise
    except (ValueError, RecursionError) as e:
        raise FormatError(f"{what} is not valid JSON: {e}") from None
    _check(value)
    return value
