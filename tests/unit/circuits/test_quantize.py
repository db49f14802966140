"""Canonical quantisation, field encoding and big-integer decoding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dk.circuits.quantize import (
    P,
    dequantize,
    felt_to_int,
    felts_to_array,
    int_to_felt,
    quantize,
    snap,
    tensor_felts,
)
from dk.errors import FormatError


def test_round_half_even_and_twos_complement() -> None:
    # 2**-13 * k at scale 12 is a tie for odd k: ties go to the even integer.
    v = np.array([1, 3, 5, -1, -3], dtype=np.float32) * np.float32(2.0**-13)
    assert quantize(v, 12).tolist() == [0, 2, 2, 0, -2]
    assert int_to_felt(-1) == (P - 1).to_bytes(32, "little").hex()
    assert int_to_felt(5) == "05" + "00" * 31
    assert tensor_felts(np.array([[-0.25]], np.float32), 12)[0] == int_to_felt(-1024)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-(2**23) + 1, max_value=2**23 - 1))
def test_felt_round_trip(q: int) -> None:
    assert felt_to_int(int_to_felt(q)) == q
    v = dequantize(np.array([q]), 12)
    assert v.dtype == np.float32 and quantize(v, 12)[0] == q  # exact in float32


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-100, 100, width=32), min_size=1, max_size=20))
def test_snap_is_idempotent_and_close(values: list[float]) -> None:
    a = np.array(values, np.float32)
    s = snap(a, 10)
    assert np.array_equal(snap(s, 10), s)
    assert np.max(np.abs(s.astype(np.float64) - a)) <= 2.0**-11


def test_bad_values_and_felts_are_refused() -> None:
    with pytest.raises(FormatError, match="non-finite"):
        quantize(np.array([np.nan]), 12)
    with pytest.raises(FormatError, match="quantisation range"):
        quantize(np.array([4096.0]), 12)
    with pytest.raises(FormatError, match="reduced"):
        felt_to_int(P.to_bytes(32, "little").hex())
    with pytest.raises(FormatError, match="64 lowercase hex"):
        felt_to_int("00")
    with pytest.raises(FormatError, match="lowercase hex"):
        felt_to_int("zz" * 32)
    with pytest.raises(FormatError, match="do not fill"):
        felts_to_array([int_to_felt(1)], (2,))
    with pytest.raises(FormatError, match="outside"):
        felts_to_array([int_to_felt(2**30)], (1,))


def test_sha256_set_digest_is_order_free_and_sensitive_to_one_ulp() -> None:
    from dk.circuits.quantize import tensor_digest

    a = {"b": np.ones((2, 3), np.float32), "a": np.arange(4, dtype=np.float32)}
    b = {"a": a["a"], "b": a["b"]}
    assert tensor_digest(a, 12, "sha256") == tensor_digest(b, 12, "sha256")
    c = {"a": a["a"].copy(), "b": a["b"]}
    c["a"][3] += np.float32(2.0**-12)
    assert tensor_digest(c, 12, "sha256") != tensor_digest(a, 12, "sha256")
    # Below half an ulp the canonical quantisation, and so the digest, does not move.
    c["a"][3] = a["a"][3] + np.float32(2.0**-14)
    assert tensor_digest(c, 12, "sha256") == tensor_digest(a, 12, "sha256")
    with pytest.raises(FormatError, match="empty"):
        tensor_digest({}, 12, "sha256")


@pytest.mark.ezkl
def test_poseidon_set_digest_matches_ezkl() -> None:
    ezkl = pytest.importorskip("ezkl")
    from dk.circuits.quantize import tensor_digest

    t = {"w": np.array([[0.5, -0.25]], np.float32)}
    per = ezkl.poseidon_hash([int_to_felt(2048), int_to_felt(-1024)])
    assert tensor_digest(t, 12) == ezkl.poseidon_hash(per)[0]


def test_felts_must_be_lowercase_hex() -> None:
    """SPEC IV §3.2: only the canonical spelling decodes (upper case and spaces are refused)."""
    import pytest as _pytest

    from dk.circuits.quantize import felt_to_int
    from dk.errors import FormatError

    assert felt_to_int("0a" + "00" * 31) == 10
    for bad in ("0A" + "00" * 31, "01" + " " * 62):
        with _pytest.raises(FormatError, match="lowercase"):
            felt_to_int(bad)
