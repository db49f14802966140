"""Canonical JSON (SPEC §1.3) and the strict bounded parser."""

from __future__ import annotations

import json

import pytest

from dk.crypto.canonical_json import MAX_DEPTH, canonical_json, parse_json
from dk.errors import FormatError


def test_keys_sorted_and_no_whitespace() -> None:
    assert canonical_json({"b": 1, "a": [1, 2, {"d": None, "c": True}]}) == (
        b'{"a":[1,2,{"c":true,"d":null}],"b":1}'
    )


def test_keys_sorted_by_utf8_bytes_not_utf16() -> None:
    # U+E000 < U+1F600 by code point / UTF-8, but the reverse in UTF-16 code units (JCS order).
    out = canonical_json({"\U0001f600": 1, "\ue000": 2, "z": 3, "\u00e9": 4})
    keys = list(json.loads(out))
    assert keys == ["z", "\u00e9", "\ue000", "\U0001f600"]
    assert "\u00e9".encode() in out  # ensure_ascii=False: raw UTF-8, no \\u escapes


def test_numbers() -> None:
    assert canonical_json([0.05, 1e-08, 1.0, -0.0, 10**20, True, False]) == (
        b"[0.05,1e-08,1.0,-0.0,100000000000000000000,true,false]"
    )
    assert canonical_json((1, 2)) == b"[1,2]"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), {"x": [float("nan")]}])
def test_rejects_non_finite(bad: object) -> None:
    with pytest.raises(FormatError, match="finite"):
        canonical_json(bad)


@pytest.mark.parametrize(
    "bad", [{1: "x"}, {"a": b"bytes"}, {"a": {1, 2}}, {"\ud800": 1}, ["\udfff"]]
)
def test_rejects_unencodable(bad: object) -> None:
    with pytest.raises(FormatError):
        canonical_json(bad)


def _nest(depth: int) -> object:
    v: object = 0
    for _ in range(depth):
        v = [v]
    return v


def test_depth_limit() -> None:
    canonical_json(_nest(MAX_DEPTH))  # 32 nested arrays: allowed
    with pytest.raises(FormatError, match="deeper than"):
        canonical_json(_nest(MAX_DEPTH + 1))  # 33: "deeper than 32" (SPEC §1.3)


def test_parse_round_trip() -> None:
    value = {"a": [1, 2.5, None, "\u00e9"], "b": {"c": False}}
    data = canonical_json(value)
    assert parse_json(data, limit=len(data)) == value
    assert canonical_json(parse_json(data, limit=1000)) == data


@pytest.mark.parametrize(
    "data, match",
    [
        (b'{"a": 1, "a": 2}', "duplicate"),
        (b'{"x": {"a": 1, "a": 1}}', "duplicate"),
        (b"[NaN]", "NaN"),
        (b"[Infinity]", "Infinity"),
        (b"[-Infinity]", "Infinity"),
        (b"[1e400]", "finite"),
        (b'["\xff\xfe"]', "UTF-8"),
        (b'"\\ud800"', "surrogate"),
        (b'{"\\udc00": 1}', "surrogate"),
        (b"{", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1] [2]", "not valid JSON"),
        (b"[" + b"1" * 5000 + b"]", "not valid JSON"),
        (b"[" * 40 + b"]" * 40, "deeper than"),
        (b"[" * 100_000 + b"]" * 100_000, "JSON"),
    ],
)
def test_parse_rejects(data: bytes, match: str) -> None:
    with pytest.raises(FormatError, match=match):
        parse_json(data, limit=1 << 20)


def test_parse_size_limit_names_the_document() -> None:
    with pytest.raises(FormatError, match="manifest is 9 bytes, over the 8-byte limit"):
        parse_json(b'{"a": 11}', limit=8, what="manifest")
    assert parse_json(b'{"a": 1}', limit=8) == {"a": 1}
