"""Canonical JSON (SPEC §1.3) and the strict bounded parser."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dk.crypto.canonical_json import MAX_DEPTH, canonical_json, encode_parsed, parse_json
from dk.errors import FormatError


def test_keys_sorted_and_no_whitespace() -> None:
    assert canonical_json({"b": 1, "a": [1, 2, {"d": None, "c": True}]}) == (
        b'{"a":[1,2,{"c":true,"d":null}],"b":1}'
    )


def test_keys_sorted_by_utf16_code_units() -> None:
    # RFC 8785 §3.2.3: U+1F600 is the surrogate pair D83D DE00, which sorts before U+E000,
    # although its code point (and its UTF-8 bytes) sort after.
    out = canonical_json({"\U0001f600": 1, "\ue000": 2, "z": 3, "\u00e9": 4})
    keys = list(json.loads(out))
    assert keys == ["z", "\u00e9", "\U0001f600", "\ue000"]
    assert "\u00e9".encode() in out  # raw UTF-8, no \\u escapes


def test_numbers() -> None:
    assert canonical_json([0.05, 1e-08, 1.0, -0.0, 10**19, 1e20, 1e21, 1e-6, 1e-7, True]) == (
        b"[0.05,1e-8,1,0,10000000000000000000,100000000000000000000,1e+21,0.000001,1e-7,true]"
    )
    assert canonical_json((1, 2)) == b"[1,2]"
    assert (
        canonical_json([2**64 - 1, -(2**64) + 1]) == b"[18446744073709551615,-18446744073709551615]"
    )


@pytest.mark.parametrize("bad", [2**64, -(2**64), 10**30])
def test_rejects_integers_outside_the_extension(bad: int) -> None:
    with pytest.raises(FormatError, match="2\\*\\*64"):
        canonical_json([bad])


def es_number_to_string(x: float) -> str:
    """ECMA-262 Number::toString(x) written from the standard's text (the RFC 8785 rule).

    Python's ``repr`` gives the shortest round-trip digits ``s`` (k digits) and the exponent;
    ``n`` is the position of the decimal point relative to the digits.
    """
    if x == 0:
        return "0"
    if x < 0:
        return "-" + es_number_to_string(-x)
    mant, _, exp = repr(x).partition("e")
    ip, _, fp = mant.partition(".")
    digits = ip + fp
    n = len(ip) + (int(exp) if exp else 0)
    stripped = digits.lstrip("0")
    n -= len(digits) - len(stripped)
    s = stripped.rstrip("0")
    k = len(s)
    if k <= n <= 21:
        return s + "0" * (n - k)
    if 0 < n <= 21:
        return s[:n] + "." + s[n:]
    if -6 < n <= 0:
        return "0." + "0" * -n + s
    e = n - 1
    return (s[0] + ("." + s[1:] if k > 1 else "")) + "e" + ("+" if e >= 0 else "-") + str(abs(e))


def test_floats_follow_ecmascript_on_random_doubles() -> None:
    """An independent Number::toString, against the encoder, on seeded doubles of every size."""
    rng = np.random.default_rng(1185)
    bits = rng.integers(0, 2**63 - 1, 20_000, dtype=np.int64)
    bits[::2] |= np.int64(-(2**63))  # negatives
    values = [v for v in bits.view(np.float64).tolist() if math.isfinite(v)]
    values += [float(10.0**e) for e in range(-30, 30)] + [1.5e-7, 2.5e21, 123456789012345680.0]
    for v in values:
        text = canonical_json(v)
        assert text == es_number_to_string(v).encode(), v
        back = parse_json(text, limit=64)
        assert float(back) == v  # round trip (the sign of zero is not kept)


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
        (b"[" + b"1" * 5000 + b"]", "finite"),  # an integer token this long is binary64: inf
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


def test_deep_nesting_is_refused_even_with_a_raised_recursion_limit() -> None:
    """A library that raised the recursion limit (PyTorch's compiler does) must not let a
    100 000-deep document overflow the C stack of the JSON scanner (it segfaulted the suite)."""
    import sys

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1_000_000)
    try:
        for data in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000):
            with pytest.raises(FormatError, match="deeper than 32"):
                parse_json(data, limit=1 << 20)
        # brackets inside strings (escaped quotes included) do not count
        inside = b'["' + b"[" * 100 + b'\\"' + b"{" * 100 + b'", ' + b"[" * 31 + b"]" * 31 + b"]"
        assert len(parse_json(inside, limit=1 << 20)) == 2
    finally:
        sys.setrecursionlimit(old)


def _random_doc(rng: np.random.Generator, depth: int = 0) -> object:
    """A random JSON value: floats of every magnitude, strings with escapes and non-ASCII text
    (astral characters included), small integers, nested objects and arrays."""
    kind = int(rng.integers(0, 7 if depth < 4 else 4))
    if kind == 0:
        return float(rng.standard_normal() * 10.0 ** int(rng.integers(-9, 23)))
    if kind == 1:
        alphabet = ["a", "Z", "0", " ", '"', "\\", "\n", "\x01", "\x1f", "é", "€", "\U0001f600"]
        return "".join(alphabet[int(i)] for i in rng.integers(0, len(alphabet), 6))
    if kind == 2:
        return int(rng.integers(-(2**53), 2**53))
    if kind == 3:
        return [None, True, False, 0.0, -0.0, 1.0, 100.0][int(rng.integers(0, 7))]
    if kind == 4:
        return [_random_doc(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]
    keys = ["b", "a", "é", "\U0001f600", "\uffff", "k\n", "aa", ""]
    return {keys[int(i)]: _random_doc(rng, depth + 1) for i in rng.integers(0, len(keys), 4)}


def test_fast_paths_are_byte_identical_to_the_rfc8785_library() -> None:
    """The encoder writes plain strings and fixed-notation floats itself (speed); on seeded
    random documents its bytes are the library's (``rfc8785.dumps`` of the whole document)."""
    import rfc8785

    rng = np.random.default_rng(8785)
    for _ in range(3000):
        doc = _random_doc(rng)
        text = canonical_json(doc)
        assert text == rfc8785.dumps(doc), doc
        assert encode_parsed(parse_json(text, limit=1 << 20)) == text  # what the verifier checks
    for v in [1e-7, 1e-6, 1e-5, 1e-4, 0.1, 1.0, 10.0, 1e15, 1e16, 1e20, 1e21, 1e22, 5e-324]:
        for x in (v, -v, v * 1.5, -v * 3.25):
            assert canonical_json(x) == rfc8785.dumps(x), x


def test_string_fast_path_matches_rfc8785_for_every_code_point() -> None:
    # canonical_json writes printable ASCII strings itself; everything else goes to rfc8785.
    import random

    import rfc8785

    rng = random.Random(7)
    chars = [chr(i) for i in range(0x110000) if not 0xD800 <= i < 0xE000]
    for c in chars:
        assert canonical_json(c) == rfc8785.dumps(c)
    pool = [*chars[:0x300], '"', "\\", "\u2028"]
    for _ in range(2000):
        s = "".join(rng.choice(pool) for _ in range(8))
        assert canonical_json({s: s}) == b"{" + rfc8785.dumps(s) + b":" + rfc8785.dumps(s) + b"}"
