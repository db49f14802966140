"""Generate ``vectors/compress/``: wire messages, codec outputs and generator outputs.

Deterministic (fixed seeds); ``python -m vectors.gen compress``. Checked by
:mod:`dk.vectors.compress`.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from dk.compress import decode, encode, parse_codec
from dk.compress.reference import rng_reference
from dk.compress.wire import Reason
from dk.vectors import write_cases

CODEC_SPECS = [
    "none",
    "topk:0.25",
    "topk:ratio=0.25,approx=1,samples=8",
    "int8:block=4",
    "int4:block=3",
    "qsgd:levels=3,block=5,seed=42",
]


def _input(shape: tuple[int, ...], seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    if x.size > 3:
        x.reshape(-1)[3] = x.reshape(-1)[0]  # a magnitude tie
    return x


def _header(
    codec: int,
    shape: tuple[int, ...],
    payload: bytes,
    *,
    magic=b"DKGC",
    version=1,
    dtype=1,
    ndim=None,
    length=None,
) -> bytes:
    nd = len(shape) if ndim is None else ndim
    head = magic + bytes([version, codec, dtype, nd]) + struct.pack(f"<{len(shape)}Q", *shape)
    return head + struct.pack("<Q", len(payload) if length is None else length) + payload


def _f32(*v: float) -> bytes:
    return struct.pack(f"<{len(v)}f", *v)


def _u32(*v: int) -> bytes:
    return struct.pack(f"<{len(v)}I", *v)


def _invalid() -> list[tuple[str, bytes, str]]:
    dense = _header(0, (2,), _f32(1.0, 2.0))
    return [
        ("shorter than the fixed header", b"DKGC\x01", Reason.TRUNCATED),
        ("wrong magic", b"DKGX" + dense[4:], Reason.BAD_MAGIC),
        ("version 2", _header(0, (2,), _f32(1, 2), version=2), Reason.BAD_VERSION),
        ("codec id 5 is unassigned", _header(5, (2,), _f32(1, 2)), Reason.UNKNOWN_CODEC),
        (
            "dtype 2 (float16) is not supported",
            _header(0, (2,), _f32(1, 2), dtype=2),
            Reason.BAD_DTYPE,
        ),
        ("ndim 9 exceeds 8", _header(0, (), b"", ndim=9), Reason.NDIM_LIMIT),
        ("shape cut short", dense[:12], Reason.TRUNCATED),
        ("2**31 elements", _header(0, (2**16, 2**15), b""), Reason.ELEMENT_LIMIT),
        ("payload length 2**34", _header(0, (2,), b"", length=2**34), Reason.PAYLOAD_LIMIT),
        ("trailing byte", dense + b"\x00", Reason.LENGTH_MISMATCH),
        ("dense payload one value short", _header(0, (2,), _f32(1.0)), Reason.PAYLOAD_LENGTH),
        ("dense NaN", _header(0, (2,), _f32(1.0, float("nan"))), Reason.NON_FINITE),
        ("top-k k > n", _header(1, (2,), _u32(3)), Reason.K_RANGE),
        ("top-k repeated index", _header(1, (4,), _u32(2, 1, 1) + _f32(1, 2)), Reason.INDEX_ORDER),
        (
            "top-k decreasing indices",
            _header(1, (4,), _u32(2, 2, 1) + _f32(1, 2)),
            Reason.INDEX_ORDER,
        ),
        ("top-k index = n", _header(1, (4,), _u32(1, 4) + _f32(1)), Reason.INDEX_RANGE),
        ("top-k +inf value", _header(1, (4,), _u32(1, 0) + _f32(float("inf"))), Reason.NON_FINITE),
        (
            "top-k unused payload byte",
            _header(1, (4,), _u32(1, 0) + _f32(1) + b"\x00"),
            Reason.PAYLOAD_LENGTH,
        ),
        ("int8 block 0", _header(2, (2,), _u32(0) + b"\x01\x01"), Reason.BAD_BLOCK),
        (
            "int8 block 2**20+1",
            _header(2, (2,), _u32(2**20 + 1) + _f32(1) + b"\x01\x01"),
            Reason.BAD_BLOCK,
        ),
        (
            "int8 negative scale",
            _header(2, (2,), _u32(2) + _f32(-1) + b"\x01\x01"),
            Reason.BAD_SCALE,
        ),
        ("int8 scale -0.0", _header(2, (2,), _u32(2) + _f32(-0.0) + b"\x00\x00"), Reason.BAD_SCALE),
        (
            "int8 NaN scale",
            _header(2, (2,), _u32(2) + _f32(float("nan")) + b"\x01\x01"),
            Reason.NON_FINITE,
        ),
        ("int8 code -128", _header(2, (2,), _u32(2) + _f32(1) + b"\x80\x01"), Reason.CODE_RANGE),
        ("int4 code -8", _header(3, (2,), _u32(2) + _f32(1) + b"\x18"), Reason.CODE_RANGE),
        (
            "int4 padding nibble set",
            _header(3, (1,), _u32(2) + _f32(1) + b"\x11"),
            Reason.NONCANONICAL,
        ),
        (
            "qsgd levels 0",
            _header(4, (2,), _u32(2) + b"\x00" + _f32(1) + b"\x00\x00"),
            Reason.BAD_LEVELS,
        ),
        (
            "qsgd levels 128",
            _header(4, (2,), _u32(2) + b"\x80" + _f32(1) + b"\x00\x00"),
            Reason.BAD_LEVELS,
        ),
        (
            "qsgd |code| > levels",
            _header(4, (2,), _u32(2) + b"\x03" + _f32(1) + b"\x04\x00"),
            Reason.CODE_RANGE,
        ),
    ]


def generate(root: Path) -> None:
    """Write every compress vector file under ``root / "compress"``."""
    out = root / "compress"
    codec_cases, wire_cases = [], []
    shapes = [(), (0,), (7,), (3, 4), (2, 1, 5)]
    for spec in CODEC_SPECS:
        codec = parse_codec(spec, backend="numpy")
        for j, shape in enumerate(shapes):
            x = _input(shape, seed=len(codec_cases))
            msg = codec.compress(x, counter=1000 * j)
            data = encode(msg)
            dec = np.empty(shape, np.float32)
            codec.decompress(decode(data), dec)
            codec_cases.append(
                {
                    "tcId": len(codec_cases) + 1,
                    "comment": f"{spec} on shape {list(shape)}",
                    "result": "valid",
                    "spec": spec,
                    "counter": 1000 * j,
                    "shape": list(shape),
                    "input": x.astype("<f4").tobytes().hex(),
                    "msg": data.hex(),
                    "decompressed": dec.astype("<f4").tobytes().hex(),
                }
            )
    for comment, data, reason in _invalid():
        wire_cases.append(
            {
                "tcId": len(wire_cases) + 1,
                "comment": comment,
                "result": "invalid",
                "msg": data.hex(),
                "expected_reason": reason,
            }
        )
    rng_cases = []
    for seed, counter, count in [(0, 0, 4), (42, 7, 4), (2**64 - 1, 2**64 - 2, 4)]:
        z = np.zeros(count, np.uint64)
        rng_reference(seed, counter, z)
        rng_cases.append(
            {
                "tcId": len(rng_cases) + 1,
                "comment": "SplitMix64(seed, counter)",
                "result": "valid",
                "seed": str(seed),
                "counter": str(counter),
                "outputs": [f"{int(v):016x}" for v in z],
            }
        )
    write_cases(out / "codecs.json", "compress/codecs", codec_cases)
    write_cases(out / "wire_invalid.json", "compress/wire", wire_cases)
    write_cases(out / "rng.json", "compress/rng", rng_cases)
