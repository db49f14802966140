"""Versioned wire format of one compressed tensor (SPEC.md Part III §4).

Layout (all integers little-endian)::

    magic    4 bytes  b"DKGC"
    version  u8       1
    codec    u8       CodecId
    dtype    u8       1 = float32 (the dtype of the tensor before compression)
    ndim     u8       0 .. MAX_NDIM
    shape    ndim x u64
    length   u64      payload length in bytes
    payload  length bytes, laid out per codec (spec §4.2)

:func:`decode` checks every byte and raises :class:`dk.errors.FormatError` with a reason code
on anything malformed; it never allocates more than the bytes it was given allow.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from dk.errors import FormatError
from dk.reasons import WireReason as Reason  # the one vocabulary (dk.reasons)

MAGIC = b"DKGC"
VERSION = 1
DTYPE_FLOAT32 = 1
MAX_NDIM = 8
MAX_ELEMENTS = 2**31 - 1
MAX_PAYLOAD = 2**33
MAX_BLOCK = 2**20
MAX_LEVELS = 127
_FIXED = struct.Struct("<4sBBBB")


class CodecId(IntEnum):
    """Codec identifiers on the wire (spec §4.1); numbers are never reused."""

    DENSE = 0
    TOPK = 1
    INT8 = 2
    INT4 = 3
    QSGD = 4


@dataclass(eq=False)
class Compressed:
    """One compressed tensor: the decoded form of a wire message.

    Only the fields of the codec are set. ``indices``/``values`` of top-k may be larger
    buffers than ``k`` (reused across steps); only their first ``k`` entries count.

    Attributes:
        codec: the codec id.
        shape: shape of the original tensor.
        k: number of (index, value) pairs (top-k).
        block: block size (int8, int4, qsgd).
        levels: number of levels (qsgd).
        indices: uint32 indices, strictly increasing (top-k).
        values: float32 values (dense: all n; top-k: the selected ones).
        scales: float32 per-block scales (int8, int4: absmax/qmax; qsgd: absmax).
        codes: int8 codes (int8, qsgd) or uint8 packed nibbles (int4).
    """

    codec: CodecId
    shape: tuple[int, ...]
    k: int = 0
    block: int = 0
    levels: int = 0
    indices: np.ndarray | None = None
    values: np.ndarray | None = None
    scales: np.ndarray | None = None
    codes: np.ndarray | None = None

    @property
    def numel(self) -> int:
        """Number of elements of the original tensor."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


def _arr(a: np.ndarray | None, n: int, dtype: str) -> bytes:
    assert a is not None
    return np.ascontiguousarray(a[:n], dtype=np.dtype(dtype)).tobytes()


def _payload(c: Compressed) -> bytes:
    n = c.numel
    nb = -(-n // c.block) if c.block else 0
    if c.codec == CodecId.DENSE:
        return _arr(c.values, n, "<f4")
    if c.codec == CodecId.TOPK:
        return struct.pack("<I", c.k) + _arr(c.indices, c.k, "<u4") + _arr(c.values, c.k, "<f4")
    if c.codec in (CodecId.INT8, CodecId.INT4):
        ncodes = n if c.codec == CodecId.INT8 else (n + 1) // 2
        dt = "i1" if c.codec == CodecId.INT8 else "u1"
        return struct.pack("<I", c.block) + _arr(c.scales, nb, "<f4") + _arr(c.codes, ncodes, dt)
    if c.codec == CodecId.QSGD:
        head = struct.pack("<IB", c.block, c.levels)
        return head + _arr(c.scales, nb, "<f4") + _arr(c.codes, n, "i1")
    raise ValueError(f"unknown codec {c.codec!r}")


def encode(c: Compressed) -> bytes:
    """Serialize ``c`` (spec §4); the result decodes back to an equal message.

    Args:
        c: a well-formed compressed tensor (as produced by a codec).

    Returns:
        The wire bytes.
    """
    payload = _payload(c)
    head = _FIXED.pack(MAGIC, VERSION, int(c.codec), DTYPE_FLOAT32, len(c.shape))
    shape = struct.pack(f"<{len(c.shape)}Q", *c.shape)
    return head + shape + struct.pack("<Q", len(payload)) + payload


def wire_size(c: Compressed) -> int:
    """Length in bytes of ``encode(c)``, without encoding.

    Args:
        c: a compressed tensor.

    Returns:
        The encoded size.
    """
    n = c.numel
    nb = -(-n // c.block) if c.block else 0
    sizes = {
        CodecId.DENSE: 4 * n,
        CodecId.TOPK: 4 + 8 * c.k,
        CodecId.INT8: 4 + 4 * nb + n,
        CodecId.INT4: 4 + 4 * nb + (n + 1) // 2,
        CodecId.QSGD: 5 + 4 * nb + n,
    }
    return _FIXED.size + 8 * len(c.shape) + 8 + sizes[c.codec]


def _fail(reason: str, message: str) -> FormatError:
    return FormatError(f"compressed tensor: {message}", reason=reason)


class _Reader:
    """Bounded cursor over the payload; every read checks the remaining length."""

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def take(self, size: int, what: str) -> memoryview:
        if size > len(self.data) - self.pos:
            raise _fail(Reason.PAYLOAD_LENGTH, f"payload too short for {what}")
        out = self.data[self.pos : self.pos + size]
        self.pos += size
        return out

    def array(self, count: int, dtype: str, what: str) -> np.ndarray:
        size = count * np.dtype(dtype).itemsize
        return np.frombuffer(self.take(size, what), dtype=dtype).astype(dtype[1:], copy=True)

    def done(self) -> None:
        if self.pos != len(self.data):
            raise _fail(Reason.PAYLOAD_LENGTH, f"{len(self.data) - self.pos} unused payload bytes")


def _check_block(block: int, n: int) -> int:
    if not 1 <= block <= MAX_BLOCK:
        raise _fail(Reason.BAD_BLOCK, f"block size {block} outside [1, {MAX_BLOCK}]")
    return -(-n // block)


def _check_scales(scales: np.ndarray) -> None:
    if not np.isfinite(scales).all():
        raise _fail(Reason.NON_FINITE, "non-finite block scale")
    if (scales < 0).any() or np.signbit(scales).any():
        raise _fail(Reason.BAD_SCALE, "negative block scale")


def _decode_payload(codec: CodecId, shape: tuple[int, ...], n: int, r: _Reader) -> Compressed:
    if codec == CodecId.DENSE:
        values = r.array(n, "<f4", "dense values")
        if not np.isfinite(values).all():
            raise _fail(Reason.NON_FINITE, "non-finite value")
        return Compressed(codec, shape, values=values)
    if codec == CodecId.TOPK:
        (k,) = struct.unpack("<I", r.take(4, "k"))
        if k > n:
            raise _fail(Reason.K_RANGE, f"k = {k} exceeds the {n} elements")
        idx = r.array(k, "<u4", "indices")
        values = r.array(k, "<f4", "values")
        if k and int(idx[-1]) >= n:
            raise _fail(Reason.INDEX_RANGE, f"index {int(idx[-1])} out of range for {n} elements")
        if k > 1 and not (idx[1:] > idx[:-1]).all():
            raise _fail(Reason.INDEX_ORDER, "indices are not strictly increasing")
        if not np.isfinite(values).all():
            raise _fail(Reason.NON_FINITE, "non-finite value")
        return Compressed(codec, shape, k=k, indices=idx, values=values)
    if codec in (CodecId.INT8, CodecId.INT4, CodecId.QSGD):
        (block,) = struct.unpack("<I", r.take(4, "block size"))
        nb = _check_block(block, n)
        levels = 0
        if codec == CodecId.QSGD:
            levels = r.take(1, "levels")[0]
            if not 1 <= levels <= MAX_LEVELS:
                raise _fail(Reason.BAD_LEVELS, f"levels {levels} outside [1, {MAX_LEVELS}]")
        scales = r.array(nb, "<f4", "block scales")
        _check_scales(scales)
        if codec == CodecId.INT4:
            codes = r.array((n + 1) // 2, "|u1", "packed codes")
            if ((codes & 0x0F) == 8).any() or ((codes >> 4) == 8).any():
                raise _fail(Reason.CODE_RANGE, "int4 code -8 is outside [-7, 7]")
            if n & 1 and codes[-1] >> 4:
                raise _fail(Reason.NONCANONICAL, "unused final nibble is not zero")
        else:
            codes = r.array(n, "|i1", "codes")
            bound = 127 if codec == CodecId.INT8 else levels
            if n and int(np.abs(codes.astype(np.int16)).max()) > bound:
                raise _fail(Reason.CODE_RANGE, f"code outside [-{bound}, {bound}]")
        return Compressed(codec, shape, block=block, levels=levels, scales=scales, codes=codes)
    raise AssertionError(codec)  # pragma: no cover - codec ids are checked by decode()


def decode(
    data: bytes | bytearray | memoryview,
    *,
    max_elements: int = MAX_ELEMENTS,
    max_payload: int = MAX_PAYLOAD,
) -> Compressed:
    """Parse and validate one wire message (spec §4).

    Args:
        data: the complete message (no trailing bytes allowed).
        max_elements: largest tensor accepted (at most :data:`MAX_ELEMENTS`).
        max_payload: largest payload accepted, in bytes (at most :data:`MAX_PAYLOAD`).

    Returns:
        The decoded :class:`Compressed`.

    Raises:
        FormatError: on any malformed input; ``.reason`` is a :class:`Reason` code.
    """
    view = memoryview(bytes(data) if not isinstance(data, bytes) else data)
    max_elements = min(max_elements, MAX_ELEMENTS)
    max_payload = min(max_payload, MAX_PAYLOAD)
    if len(view) < _FIXED.size:
        raise _fail(Reason.TRUNCATED, f"{len(view)} bytes is shorter than the 8-byte header")
    magic, version, codec, dtype, ndim = _FIXED.unpack_from(view)
    if magic != MAGIC:
        raise _fail(Reason.BAD_MAGIC, f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise _fail(Reason.BAD_VERSION, f"unsupported version {version}, expected {VERSION}")
    if codec not in CodecId._value2member_map_:
        raise _fail(Reason.UNKNOWN_CODEC, f"unknown codec id {codec}")
    if dtype != DTYPE_FLOAT32:
        raise _fail(Reason.BAD_DTYPE, f"unsupported dtype id {dtype}")
    if ndim > MAX_NDIM:
        raise _fail(Reason.NDIM_LIMIT, f"ndim {ndim} exceeds {MAX_NDIM}")
    head = _FIXED.size + 8 * ndim + 8
    if len(view) < head:
        raise _fail(Reason.TRUNCATED, f"{len(view)} bytes is shorter than the {head}-byte header")
    shape = struct.unpack_from(f"<{ndim}Q", view, _FIXED.size)
    n = 1
    for d in shape:
        n *= d  # exact Python integers: no overflow
        if d > max_elements or n > max_elements:
            raise _fail(Reason.ELEMENT_LIMIT, f"shape {shape} exceeds {max_elements} elements")
    (length,) = struct.unpack_from("<Q", view, head - 8)
    if length > max_payload:
        raise _fail(Reason.PAYLOAD_LIMIT, f"payload of {length} bytes exceeds {max_payload}")
    if len(view) != head + length:
        raise _fail(
            Reason.LENGTH_MISMATCH, f"message is {len(view)} bytes, header says {head + length}"
        )
    r = _Reader(view[head:])
    out = _decode_payload(CodecId(codec), tuple(shape), n, r)
    r.done()
    return out
