"""Canonical tensor encoding and chunked commitments (SPEC §4)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dk.crypto.encoding import (
    CHUNK_SIZE,
    DTYPE_CODES,
    MAGIC,
    decode_tensors,
    encode_tensors,
    iter_chunks,
    sorted_names,
    tensors_root,
)
from dk.crypto.merkle import leaf_hash, merkle_root
from dk.errors import FormatError

_names = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12)
_dtypes = st.sampled_from(sorted(DTYPE_CODES)).flatmap(
    lambda n: st.sampled_from([np.dtype(n), np.dtype(n).newbyteorder(">")])
)
_arrays = _dtypes.flatmap(
    lambda dt: hnp.arrays(
        dt,
        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
        elements=hnp.from_dtype(dt, allow_nan=False) if dt.kind == "f" else None,
    )
)
_sets = st.dictionaries(_names, _arrays, max_size=5)


def _ref_root(stream: bytes, chunk: int) -> bytes:
    return merkle_root([leaf_hash(stream[i : i + chunk]) for i in range(0, len(stream), chunk)])


def test_layout_of_one_tensor() -> None:
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    want = (
        MAGIC
        + struct.pack("<Q", 1)
        + struct.pack("<I", 1)
        + b"w"
        + bytes([DTYPE_CODES["int32"], 2])
        + struct.pack("<QQ", 2, 3)
        + x.astype("<i4").tobytes()
    )
    assert encode_tensors({"w": x}) == want


def test_zero_dim_tensor_keeps_shape() -> None:
    s = {"lr": np.array(0.05, dtype=np.float64), "step": np.array(7, dtype=np.int64)}
    out = decode_tensors(encode_tensors(s))
    assert out["lr"].shape == () and out["step"].shape == ()
    assert out["lr"] == 0.05 and out["step"] == 7
    # a 0-d scalar and a 1-element vector are different tensors
    assert tensors_root({"a": np.array(1.0)}) != tensors_root({"a": np.array([1.0])})


def test_names_are_sorted_by_utf8_bytes() -> None:
    names = ["b", "a\u00e9", "Z", "\U0001f600", "\ue000", "a"]
    tensors = {n: np.zeros(1, np.uint8) for n in names}
    want = sorted(names, key=lambda n: n.encode("utf-8"))
    assert sorted_names(tensors) == want
    assert list(decode_tensors(encode_tensors(tensors))) == want
    # insertion order never matters
    assert encode_tensors(dict(reversed(list(tensors.items())))) == encode_tensors(tensors)


@settings(max_examples=60, deadline=None)
@given(_sets)
def test_decode_inverts_encode(tensors: dict[str, np.ndarray]) -> None:
    stream = encode_tensors(tensors)
    out = decode_tensors(stream)
    assert list(out) == sorted_names(tensors)
    for name, arr in tensors.items():
        assert out[name].shape == arr.shape
        assert out[name].dtype == arr.dtype.newbyteorder("=")
        np.testing.assert_array_equal(out[name], arr)
    assert encode_tensors(out) == stream  # byte order of the input never leaks into the stream


@settings(max_examples=40, deadline=None)
@given(_sets, st.integers(1, 40))
def test_chunks_cut_the_stream(tensors: dict[str, np.ndarray], chunk: int) -> None:
    stream = encode_tensors(tensors)
    chunks = [bytes(c) for c in iter_chunks(tensors, chunk)]
    assert b"".join(chunks) == stream
    assert all(len(c) == chunk for c in chunks[:-1]) and 0 < len(chunks[-1]) <= chunk
    assert tensors_root(tensors, chunk_size=chunk) == _ref_root(stream, chunk)


@pytest.mark.parametrize(
    "tensors",
    [
        pytest.param({"w": np.zeros(CHUNK_SIZE // 4, np.float32)}, id="tensor-exactly-one-chunk"),
        pytest.param({"w": np.ones(CHUNK_SIZE, np.uint8)}, id="uint8-exactly-one-chunk"),
        pytest.param(
            {
                "a": np.ones(CHUNK_SIZE - 12 - 4 - 1 - 2 - 8 - 3, np.uint8),
                "b" * 40: np.arange(5, dtype=np.int64),
            },
            id="header-straddles-boundary",
        ),
        pytest.param(
            {"a": np.ones(CHUNK_SIZE - 42, np.uint8), "b": np.ones(3 * CHUNK_SIZE, np.uint8)},
            id="stream-exactly-four-chunks",
        ),
        pytest.param({"w": np.arange(CHUNK_SIZE + 1, dtype=np.uint8)}, id="one-byte-spill"),
    ],
)
def test_chunk_boundaries(tensors: dict[str, np.ndarray]) -> None:
    stream = encode_tensors(tensors)
    chunks = [bytes(c) for c in iter_chunks(tensors)]
    assert b"".join(chunks) == stream
    assert all(len(c) == CHUNK_SIZE for c in chunks[:-1])
    assert tensors_root(tensors) == _ref_root(stream, CHUNK_SIZE)


def test_straddle_case_really_straddles() -> None:
    n = CHUNK_SIZE - 12 - 4 - 1 - 2 - 8 - 3
    stream = encode_tensors({"a": np.ones(n, np.uint8), "b" * 40: np.arange(5, dtype=np.int64)})
    second_header = stream.index(b"b" * 40) - 4
    assert second_header < CHUNK_SIZE < second_header + 4 + 40 + 2 + 8


def test_four_chunk_case_is_exact() -> None:
    tensors = {"a": np.ones(CHUNK_SIZE - 42, np.uint8), "b": np.ones(3 * CHUNK_SIZE, np.uint8)}
    assert len(encode_tensors(tensors)) == 4 * CHUNK_SIZE
    assert [len(c) for c in iter_chunks(tensors)] == [CHUNK_SIZE] * 4


def test_threads_do_not_change_the_root() -> None:
    rng = np.random.default_rng(0)
    tensors = {
        f"t{i}": rng.standard_normal(rng.integers(1, 40_000)).astype(np.float32) for i in range(12)
    }
    assert tensors_root(tensors, threads=2) == tensors_root(tensors, threads=1)
    assert tensors_root(tensors, threads=4, chunk_size=1000) == tensors_root(
        tensors, chunk_size=1000
    )


def test_chunk_size_must_be_positive() -> None:
    for bad in (0, -1):
        with pytest.raises(ValueError, match="chunk_size"):
            tensors_root({"a": np.zeros(3, np.float32)}, chunk_size=bad)


def test_non_contiguous_and_empty_inputs() -> None:
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    assert encode_tensors({"x": x.T}) == encode_tensors({"x": np.ascontiguousarray(x.T)})
    assert decode_tensors(encode_tensors({})) == {}
    assert tensors_root({}) == _ref_root(MAGIC + bytes(8), CHUNK_SIZE)
    e = decode_tensors(encode_tensors({"e": np.zeros((0, 3), np.float32)}))["e"]
    assert e.shape == (0, 3)


@pytest.mark.parametrize(
    "tensors, match",
    [
        ({"x": np.zeros(2, np.float16)}, "not encodable"),
        ({"x": np.zeros(2, np.complex64)}, "not encodable"),
        ({"x": np.zeros((1,) * 9, np.float32)}, "dimensions"),
        ({"": np.zeros(1, np.float32)}, "name"),
        ({"n" * 1025: np.zeros(1, np.float32)}, "name"),
        ({"\ud800": np.zeros(1, np.float32)}, "Unicode"),
    ],
)
def test_encode_rejects(tensors: dict[str, np.ndarray], match: str) -> None:
    with pytest.raises(FormatError, match=match):
        encode_tensors(tensors)


def _two() -> bytes:
    return encode_tensors({"a": np.arange(3, dtype=np.int32), "b": np.array(2.5)})


def test_decode_rejects_every_truncation() -> None:
    stream = _two()
    for n in range(len(stream)):
        with pytest.raises(FormatError):
            decode_tensors(stream[:n])


def test_decode_rejects_trailing_bytes_and_bad_magic() -> None:
    stream = _two()
    with pytest.raises(FormatError, match="trailing"):
        decode_tensors(stream + b"\x00")
    with pytest.raises(FormatError, match="magic"):
        decode_tensors(b"DKT2" + stream[4:])


def test_decode_rejects_bad_order_and_duplicates() -> None:
    a = encode_tensors({"a": np.arange(3, dtype=np.int32)})[12:]
    b = encode_tensors({"b": np.array(2.5)})[12:]
    count = MAGIC + struct.pack("<Q", 2)
    assert decode_tensors(count + a + b)
    with pytest.raises(FormatError, match="ascending"):
        decode_tensors(count + b + a)
    with pytest.raises(FormatError, match="ascending"):
        decode_tensors(count + a + a)


def test_decode_rejects_bad_fields() -> None:
    one = bytearray(encode_tensors({"a": np.arange(3, dtype=np.int32)}))
    # dtype code at 12 + 4 + 1, rank right after it
    bad_code = bytearray(one)
    bad_code[17] = 99
    with pytest.raises(FormatError, match="dtype"):
        decode_tensors(bytes(bad_code))
    bad_rank = bytearray(one)
    bad_rank[18] = 9
    with pytest.raises(FormatError):
        decode_tensors(bytes(bad_rank))
    huge = bytearray(one)
    huge[19:27] = struct.pack("<Q", 2**62)
    with pytest.raises(FormatError, match="truncated"):
        decode_tensors(bytes(huge))
    bad_name = bytearray(one)
    bad_name[16] = 0xFF
    with pytest.raises(FormatError, match="UTF-8"):
        decode_tensors(bytes(bad_name))
    with pytest.raises(FormatError, match="count"):
        decode_tensors(MAGIC + struct.pack("<Q", 2**40))
    with pytest.raises(FormatError, match="name length"):
        decode_tensors(MAGIC + struct.pack("<Q", 1) + struct.pack("<I", 0) + b"\x01\x00")
