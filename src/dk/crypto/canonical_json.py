"""Canonical JSON (SPEC §1.3): RFC 8785 (JCS), and a strict, bounded JSON parser.

Canonical form is the JSON Canonicalization Scheme of RFC 8785: UTF-8, no insignificant
whitespace, object keys sorted by their UTF-16 code units, strings escaped as ECMAScript's
``JSON.stringify`` does, floats written as ECMAScript's ``Number.prototype.toString``
(``1e-8``, ``0.05``, ``1``, ``1e+21``; ``-0`` as ``0``), no NaN or infinities. Strings and
floats are serialised by the ``rfc8785`` library (Trail of Bits). dk's one extension:
integers (Python ``int``; in a document, a number written without fraction or exponent) are
written in plain decimal up to ``|n| < 2**64``, where JCS stops at ``2**53`` (I-JSON).
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

import rfc8785

from dk.errors import FormatError

MAX_DEPTH = 32
INT_LIMIT = 1 << 64  # integers in canonical JSON lie strictly between -INT_LIMIT and INT_LIMIT


def _check_text(s: str) -> None:
    # A JSON "\ud800" escape parses to a lone surrogate, which has no UTF-8 encoding.
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise FormatError("JSON strings must be valid Unicode (no lone surrogates)") from None


def _plain(s: str) -> bool:
    # printable ASCII without '"' or '\\': JSON.stringify writes it as is (RFC 8785 §3.2.2.2)
    return s.isascii() and s.isprintable() and '"' not in s and "\\" not in s


def _check(value: Any, depth: int = 0) -> bool:
    """Raise FormatError for what canonical JSON cannot hold; return True iff ``value`` is
    *plain*: built of exactly dict, list, tuple, str, int, bool and None, with every string
    and key printable ASCII without '"' or '\\' (so no floats and nothing to escape)."""
    t = type(value)  # fast paths for the common leaves; subclasses take the general path
    if t is str:
        if value.isascii():
            return value.isprintable() and '"' not in value and "\\" not in value
        _check_text(value)
        return False
    if t is int:
        if not -INT_LIMIT < value < INT_LIMIT:
            raise FormatError("JSON integers must lie strictly between -2**64 and 2**64")
        return True
    if value is None or t is bool:
        return True
    if isinstance(value, dict | list | tuple) and depth >= MAX_DEPTH:
        raise FormatError(f"JSON nested deeper than {MAX_DEPTH}")
    plain = t is dict or t is list or t is tuple
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise FormatError("JSON object keys must be strings")
            if type(k) is str and k.isascii():
                plain = plain and _plain(k)
            else:
                _check_text(k)
                plain = False
            plain = _check(v, depth + 1) and plain
    elif isinstance(value, list | tuple):
        for v in value:
            plain = _check(v, depth + 1) and plain
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise FormatError("JSON numbers must be finite")
    elif isinstance(value, str):
        _check_text(value)
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int):
        if not -INT_LIMIT < value < INT_LIMIT:
            raise FormatError("JSON integers must lie strictly between -2**64 and 2**64")
    else:
        raise FormatError(f"cannot encode {type(value).__name__} in canonical JSON")
    return plain


def _string(s: str) -> bytes:
    if _plain(s):
        return b'"' + s.encode("ascii") + b'"'
    return rfc8785.dumps(s)


def _encode(value: Any, out: list[bytes]) -> None:
    # ``value`` has passed _check: finite floats, str keys, valid Unicode, bounded depth.
    t = type(value)
    if t is str:
        out.append(_string(value))
    elif t is int:
        out.append(str(value).encode("ascii"))
    elif value is None:
        out.append(b"null")
    elif value is True:
        out.append(b"true")
    elif value is False:
        out.append(b"false")
    elif isinstance(value, int):
        out.append(str(int(value)).encode("ascii"))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, float):
        out.append(rfc8785.dumps(value))  # ES Number::toString (RFC 8785 §3.2.2.3)
    elif isinstance(value, dict):
        out.append(b"{")
        # RFC 8785 §3.2.3: keys sorted by UTF-16 code units (big-endian bytes compare alike);
        # for ASCII keys that is plain string order.
        keys = sorted(value)
        if not all(k.isascii() for k in keys):
            keys = sorted(value, key=lambda k: k.encode("utf-16-be"))
        for i, k in enumerate(keys):
            if i:
                out.append(b",")
            out.append(_string(k))
            out.append(b":")
            _encode(value[k], out)
        out.append(b"}")
    else:
        out.append(b"[")
        for i, v in enumerate(value):
            if i:
                out.append(b",")
            _encode(v, out)
        out.append(b"]")


def canonical_json(value: Any) -> bytes:
    """Encode ``value`` as canonical JSON bytes: RFC 8785 with 64-bit integers (SPEC §1.3).

    Raises:
        FormatError: for a value canonical JSON cannot hold (NaN, infinities, non-string keys,
            lone surrogates, integers outside ``(-2**64, 2**64)``, nesting deeper than 32,
            other types).
    """
    if _check(value):
        # a plain value (see _check) has no floats and no string to escape, and its keys are
        # ASCII, whose code-point order is UTF-16 order: the standard encoder writes exactly
        # the canonical form (integers in plain decimal)
        return _PLAIN_ENCODER.encode(value).encode("ascii")
    out: list[bytes] = []
    _encode(value, out)
    return b"".join(out)


_PLAIN_ENCODER = json.JSONEncoder(
    ensure_ascii=True, allow_nan=False, sort_keys=True, separators=(",", ":"), check_circular=False
)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise FormatError(f"duplicate JSON key {k!r}")
        out[k] = v
    return out


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
SAFE_RECURSION_LIMIT = 4000  # below it the C scanner raises RecursionError, never overflows
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")


def _nesting(data: bytes) -> int:
    """Deepest ``[``/``{`` nesting of a document, strings skipped, before any parsing.

    The C JSON scanner recurses once per level and stops at the interpreter's recursion limit;
    when a library has raised that limit (PyTorch's compiler does), a hostile document could
    exhaust the C stack instead (a segmentation fault, seen in the test suite), so the depth
    is bounded first.
    """
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKET)
    if len(brackets) > 4096:  # vectorised for large documents
        import numpy as np

        b = np.frombuffer(brackets, dtype=np.uint8)
        steps = np.where((b == 0x5B) | (b == 0x7B), 1, -1)
        return int(np.cumsum(steps).max(initial=0))
    depth = deepest = 0
    for c in brackets:
        depth += 1 if c in (0x5B, 0x7B) else -1
        deepest = max(deepest, depth)
    return deepest


def _parse_int(text: str) -> int | float:
    # SPEC §1.3: an integer token beyond the integer range is a binary64 number, as in JCS
    # (ES writes doubles that are integers below 1e21 without fraction or exponent).
    n = int(text) if len(text) <= 21 else INT_LIMIT
    return n if -INT_LIMIT < n < INT_LIMIT else float(text)


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
    if (
        data.count(b"[") + data.count(b"{") > MAX_DEPTH
        and sys.getrecursionlimit() > SAFE_RECURSION_LIMIT
        and _nesting(data) > MAX_DEPTH
    ):
        raise FormatError(f"{what}: JSON nested deeper than {MAX_DEPTH}")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_reject_constant,
            parse_int=_parse_int,
        )
    except FormatError:
        raise
    except (ValueError, RecursionError) as e:
        raise FormatError(f"{what} is not valid JSON: {e}") from None
    _check(value)
    return value
