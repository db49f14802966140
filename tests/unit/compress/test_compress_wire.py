"""Wire format: round trips, one test per reason code, and fuzzing."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dk.compress import decode, encode, parse_codec
from dk.compress.wire import Reason, wire_size
from dk.errors import FormatError

SPECS = ["none", "topk:0.1", "int8:block=16", "int4:block=7", "qsgd:levels=5,block=9,seed=1"]


def _message(spec: str, shape=(5, 7), seed=0) -> bytes:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return encode(parse_codec(spec, backend="numpy").compress(x, counter=3))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (5, 7), (2, 1, 3)])
def test_round_trip(spec, shape):
    codec = parse_codec(spec, backend="numpy")
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    msg = codec.compress(x, counter=11)
    data = encode(msg)
    assert len(data) == wire_size(msg)
    back = decode(data)
    assert back.shape == shape and encode(back) == data
    a, b = np.empty(shape, np.float32), np.empty(shape, np.float32)
    codec.decompress(msg, a)
    codec.decompress(back, b)
    assert np.array_equal(a, b)


def test_golden_bytes():
    x = np.array([0.5, -2.0, 1.0], dtype=np.float32)
    data = encode(parse_codec("topk:0.5", backend="numpy").compress(x))
    # magic, version 1, codec TOPK, dtype f32, ndim 1, shape [3], payload 20 bytes,
    # k = 2, indices [1, 2], values [-2.0, 1.0]: ceil(0.5 * 3) = 2 largest magnitudes
    assert data.hex() == (
        "444b47430101010103000000000000001400000000000000020000000100000002000000000000c00000803f"
    )


def _patch(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new) :]


def _topk(k: int, idx: list[int], val: list[float], n: int = 10) -> bytes:
    payload = struct.pack("<I", k) + struct.pack(f"<{len(idx)}I", *idx)
    payload += struct.pack(f"<{len(val)}f", *val)
    return b"DKGC\x01\x01\x01\x01" + struct.pack("<QQ", n, len(payload)) + payload


def _quant(codec: int, block: int, scales: list[float], codes: bytes, n: int, extra=b"") -> bytes:
    payload = struct.pack("<I", block) + extra + struct.pack(f"<{len(scales)}f", *scales) + codes
    return bytes([*b"DKGC", 1, codec, 1, 1]) + struct.pack("<QQ", n, len(payload)) + payload


INVALID = [
    (b"DKG", Reason.TRUNCATED),
    (_patch(_message("none"), 0, b"XKGC"), Reason.BAD_MAGIC),
    (_patch(_message("none"), 4, b"\x02"), Reason.BAD_VERSION),
    (_patch(_message("none"), 5, b"\x09"), Reason.UNKNOWN_CODEC),
    (_patch(_message("none"), 6, b"\x02"), Reason.BAD_DTYPE),
    (_patch(_message("none"), 7, b"\x09"), Reason.NDIM_LIMIT),
    (_message("none")[:20], Reason.TRUNCATED),
    (_patch(_message("none"), 8, struct.pack("<Q", 2**40)), Reason.ELEMENT_LIMIT),
    (_patch(_message("none"), 24, struct.pack("<Q", 2**40)), Reason.PAYLOAD_LIMIT),
    (_message("none") + b"\x00", Reason.LENGTH_MISMATCH),
    (_patch(_message("none"), 24, struct.pack("<Q", 4 * 35 - 4))[:-4], Reason.PAYLOAD_LENGTH),
    (_topk(11, [], []), Reason.K_RANGE),
    (_topk(2, [3, 3], [1.0, 2.0]), Reason.INDEX_ORDER),
    (_topk(2, [3, 10], [1.0, 2.0]), Reason.INDEX_RANGE),
    (_topk(1, [3], [float("nan")]), Reason.NON_FINITE),
    (_topk(1, [3], [1.0]) + b"", None),
    (_quant(2, 0, [], b"", 0), Reason.BAD_BLOCK),
    (_quant(2, 4, [-1.0], b"\x01\x02", 2), Reason.BAD_SCALE),
    (_quant(2, 4, [float("inf")], b"\x01\x02", 2), Reason.NON_FINITE),
    (_quant(2, 4, [1.0], b"\x80\x02", 2), Reason.CODE_RANGE),
    (_quant(3, 4, [1.0], b"\x81", 2), Reason.CODE_RANGE),
    (_quant(3, 4, [1.0], b"\x71", 1), Reason.NONCANONICAL),
    (_quant(4, 4, [1.0], b"\x06\x02", 2, extra=b"\x05"), Reason.CODE_RANGE),
    (_quant(4, 4, [1.0], b"\x01\x02", 2, extra=b"\x00"), Reason.BAD_LEVELS),
]


@pytest.mark.parametrize(("data", "reason"), INVALID)
def test_invalid_messages(data, reason):
    if reason is None:
        assert decode(data).k == 1
        return
    with pytest.raises(FormatError) as e:
        decode(data)
    assert e.value.reason == reason and str(e.value).startswith("compressed tensor: ")


def test_caller_limits():
    data = _message("none")
    with pytest.raises(FormatError, match="exceeds 10 elements"):
        decode(data, max_elements=10)
    with pytest.raises(FormatError) as e:
        decode(data, max_payload=100)
    assert e.value.reason == Reason.PAYLOAD_LIMIT


@settings(max_examples=400, deadline=None)
@given(
    spec=st.sampled_from(SPECS),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 10_000),
)
def test_fuzz_mutations_raise_only_format_error(spec, edits, cut):
    data = bytearray(_message(spec, shape=(3, 4)))
    for pos, byte in edits:
        data[pos % len(data)] = byte
    if cut % 3 == 0:
        data = data[: cut % (len(data) + 1)]
    try:
        msg = decode(bytes(data))
    except FormatError as e:
        assert e.reason is not None
        return
    assert encode(msg) == bytes(data)  # whatever decodes is canonical


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(data):
    try:
        decode(b"DKGC\x01" + data)
    except FormatError:
        pass
