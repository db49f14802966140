"""Canonical tensor encoding and chunked checkpoint commitments (SPEC §4).

A *tensor set* (``dict[str, numpy.ndarray]``) has one canonical byte stream::

    stream  = MAGIC(b"DKT1") || u64(count) || tensor_1 || ... || tensor_count
    tensor  = u32(len(name)) || name (UTF-8) || u8(dtype code) || u8(ndim)
              || u64(dim_1) || ... || u64(dim_ndim) || data (C order, little-endian)

in ascending order of the names' UTF-8 bytes. The commitment (``tensors_root``) is the Merkle
root (SPEC §3) over the stream cut into ``CHUNK_SIZE`` byte chunks (the last one shorter).
Nothing is copied for the big tensors: chunks that fall inside one tensor are hashed straight
from its memory.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from dk.crypto.hashing import TAG_LEAF, tagged_hasher
from dk.crypto.merkle import leaf_hash, merkle_root
from dk.errors import FormatError

MAGIC = b"DKT1"
CHUNK_SIZE = 65536
MAX_NAME_BYTES = 1024
MAX_NDIM = 8

# SPEC §4.1: dtype codes. Never renumber.
DTYPE_CODES: dict[str, int] = {
    "float32": 1,
    "float64": 2,
    "int64": 3,
    "uint8": 4,
    "int32": 5,
    "uint64": 6,
}
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}
# (kind, itemsize) -> code: the same table, looked up without numpy's slow ``dtype.name``.
_KIND_CODES = {(np.dtype(k).kind, np.dtype(k).itemsize): v for k, v in DTYPE_CODES.items()}
_NATIVE_LE = sys.byteorder == "little"


def dtype_code(dt: np.dtype) -> int | None:
    """SPEC §4.1 code of a dtype, or None if it is not encodable."""
    return _KIND_CODES.get((dt.kind, dt.itemsize))


def _as_le(name: str, array: np.ndarray) -> np.ndarray:
    dt = array.dtype
    if dtype_code(dt) is None:
        raise FormatError(f"tensor {name!r}: dtype {dt} is not encodable (SPEC §4.1)")
    if array.ndim > MAX_NDIM:
        raise FormatError(f"tensor {name!r}: {array.ndim} dimensions, at most {MAX_NDIM}")
    if array.flags.c_contiguous and (dt.byteorder in "<|" or (dt.byteorder == "=" and _NATIVE_LE)):
        return array
    # np.ascontiguousarray would turn a 0-d array into shape (1,): keep the shape.
    return np.ascontiguousarray(array, dtype=dt.newbyteorder("<")).reshape(array.shape)


def tensor_header(name: str, array: np.ndarray) -> bytes:
    """Header bytes of one tensor in the canonical stream."""
    raw = _name_bytes(name)
    if not 0 < len(raw) <= MAX_NAME_BYTES:
        raise FormatError(f"tensor name must be 1..{MAX_NAME_BYTES} UTF-8 bytes: {name!r}")
    code = dtype_code(array.dtype)
    if code is None:
        raise FormatError(f"tensor {name!r}: dtype {array.dtype} is not encodable (SPEC §4.1)")
    return (
        struct.pack("<I", len(raw))
        + raw
        + bytes([code, array.ndim])
        + b"".join(struct.pack("<Q", d) for d in array.shape)
    )


def _name_bytes(name: str) -> bytes:
    try:
        return name.encode("utf-8")
    except UnicodeEncodeError:
        raise FormatError(f"tensor name {name!r} is not valid Unicode") from None


def sorted_names(tensors: Mapping[str, np.ndarray]) -> list[str]:
    """Names in canonical order (ascending UTF-8 bytes)."""
    return sorted(tensors, key=_name_bytes)


def _segments(tensors: Mapping[str, np.ndarray]) -> Iterator[memoryview]:
    yield memoryview(MAGIC + struct.pack("<Q", len(tensors)))
    for name in sorted_names(tensors):
        arr = _as_le(name, np.asarray(tensors[name]))
        yield memoryview(tensor_header(name, arr))
        if arr.size:
            yield memoryview(arr.data).cast("B")


def encode_tensors(tensors: Mapping[str, np.ndarray]) -> bytes:
    """The whole canonical stream as bytes (for vectors and small sets)."""
    return b"".join(bytes(s) for s in _segments(tensors))


def iter_chunks(
    tensors: Mapping[str, np.ndarray], chunk_size: int = CHUNK_SIZE
) -> Iterator[memoryview | bytes]:
    """Yield the canonical stream in ``chunk_size`` pieces without copying large tensors."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    pending = bytearray()
    for seg in _segments(tensors):
        pos = 0
        if pending:
            take = min(chunk_size - len(pending), len(seg))
            pending += seg[:take]
            pos = take
            if len(pending) == chunk_size:
                yield bytes(pending)
                pending = bytearray()
        while len(seg) - pos >= chunk_size:
            yield seg[pos : pos + chunk_size]
            pos += chunk_size
        if pos < len(seg):
            pending += seg[pos:]
    if pending:
        yield bytes(pending)


def chunk_leaf_hashes(
    tensors: Mapping[str, np.ndarray], *, chunk_size: int = CHUNK_SIZE, threads: int = 1
) -> list[bytes]:
    """Leaf hashes of every chunk; ``threads > 1`` hashes in parallel (same result)."""
    chunks = iter_chunks(tensors, chunk_size)
    if threads <= 1:
        return [leaf_hash(c) for c in chunks]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(leaf_hash, chunks, chunksize=16))


def tensors_root(
    tensors: Mapping[str, np.ndarray], *, chunk_size: int = CHUNK_SIZE, threads: int = 1
) -> bytes:
    """Commitment to a tensor set: Merkle root over its canonical chunks (SPEC §4.2).

    A set whose schema was seen before (names, dtypes, shapes: every checkpoint of a run) is
    hashed from a cached :class:`_StreamPlan`: its headers are not rebuilt and each chunk is
    fed to SHA-256 straight from the tensors' memory (the same bytes, the same root)."""
    if threads <= 1 and chunk_size == CHUNK_SIZE:
        plan = _plan_for(tensors)
        if plan is not None:
            return merkle_root(plan.leaf_hashes(tensors))
    return merkle_root(chunk_leaf_hashes(tensors, chunk_size=chunk_size, threads=threads))


class _StreamPlan:
    """The canonical stream (SPEC §4.1) of one schema, cut into chunks: for each chunk the
    pieces it is made of, a constant (magic, count, tensor headers) or a byte range of one
    tensor's data. Built by the reference code path, so any bad name or dtype raises there."""

    def __init__(self, tensors: Mapping[str, np.ndarray], chunk_size: int) -> None:
        self.names = sorted_names(tensors)
        pieces: list[tuple[int, bytes, int, int]] = []  # (tensor or -1, const, begin, end)
        pieces.append((-1, MAGIC + struct.pack("<Q", len(tensors)), 0, 0))
        for i, name in enumerate(self.names):
            arr = _as_le(name, np.asarray(tensors[name]))  # the reference checks
            pieces.append((-1, tensor_header(name, arr), 0, 0))
            if arr.nbytes:
                pieces.append((i, b"", 0, arr.nbytes))
        self.chunks: list[list[tuple[int, bytes, int, int]]] = [[]]
        room = chunk_size
        for idx, const, begin, end in pieces:
            pos = 0
            size = len(const) if idx < 0 else end - begin
            while pos < size:
                if room == 0:
                    self.chunks.append([])
                    room = chunk_size
                take = min(room, size - pos)
                chunk = self.chunks[-1]
                if idx < 0:
                    part = const[pos : pos + take]
                    if chunk and chunk[-1][0] < 0:  # consecutive constants: one update
                        chunk[-1] = (-1, chunk[-1][1] + part, 0, 0)
                    else:
                        chunk.append((-1, part, 0, 0))
                else:
                    chunk.append((idx, b"", pos, pos + take))
                pos += take
                room -= take

    def leaf_hashes(self, tensors: Mapping[str, np.ndarray]) -> list[bytes]:
        """The chunks' leaf hashes (SPEC §3.1), hashed from the tensors' own buffers."""
        arrays = [tensors[n] for n in self.names]
        views: list[memoryview | None] = [None] * len(arrays)
        out = []
        for chunk in self.chunks:
            parts: list[bytes | memoryview] = []
            for idx, const, begin, end in chunk:
                if idx < 0:
                    parts.append(const)
                    continue
                arr = arrays[idx]
                if begin == 0 and end == arr.nbytes:
                    parts.append(arr.data)  # C-contiguous little-endian (checked by _plan_for)
                    continue
                view = views[idx]
                if view is None:
                    view = views[idx] = arr.reshape(-1).view(np.uint8).data
                parts.append(view[begin:end])
            h = _LEAF_HASHER.copy()
            # a chunk of many small pieces (headers, small tensors) is hashed in one call (one
            # copy of at most a chunk): fewer calls, and the GIL released once, not per piece
            h.update(parts[0] if len(parts) == 1 else b"".join(parts))
            out.append(h.digest())
        return out


_LEAF_HASHER = tagged_hasher(TAG_LEAF)  # SPEC §3.1, as merkle.leaf_hash
_PLANS: dict[tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...], _StreamPlan] = {}
_MAX_PLANS = 64


def _plan_for(tensors: Mapping[str, np.ndarray]) -> _StreamPlan | None:
    """The cached plan of ``tensors``' schema; ``None`` (the reference path) for anything that
    is not a set of C-contiguous little-endian ndarrays."""
    key = []
    for name, v in tensors.items():
        if type(v) is not np.ndarray or not v.flags.c_contiguous:
            return None
        dt = v.dtype
        order = dt.byteorder
        if order == ">" or (order == "=" and not _NATIVE_LE):
            return None
        key.append((name, dt, v.shape))  # equal dtypes encode alike (their str is slower)
    k = tuple(key)
    plan = _PLANS.get(k)
    if plan is None:
        plan = _StreamPlan(tensors, CHUNK_SIZE)
        if len(_PLANS) >= _MAX_PLANS:  # bounded: a run has one or two schemas
            _PLANS.clear()
        _PLANS[k] = plan
    return plan


def decode_tensors(data: bytes, *, max_tensors: int = 100_000) -> dict[str, np.ndarray]:
    """Parse a canonical stream back into tensors (strict; used by vectors and tests)."""
    view = memoryview(data)
    if len(view) < 12 or bytes(view[:4]) != MAGIC:
        raise FormatError("not a canonical tensor stream (bad magic)")
    (count,) = struct.unpack_from("<Q", view, 4)
    if count > max_tensors:
        raise FormatError(f"tensor count {count} over the limit {max_tensors}")
    pos, out, last = 12, {}, None
    for _ in range(count):
        if pos + 4 > len(view):
            raise FormatError("truncated tensor header")
        (nlen,) = struct.unpack_from("<I", view, pos)
        if not 0 < nlen <= MAX_NAME_BYTES or pos + 4 + nlen + 2 > len(view):
            raise FormatError("bad tensor name length")
        raw = bytes(view[pos + 4 : pos + 4 + nlen])
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError("tensor name is not UTF-8") from None
        if last is not None and raw <= last:
            raise FormatError("tensor names not in strictly ascending order")
        last = raw
        pos += 4 + nlen
        code, ndim = view[pos], view[pos + 1]
        pos += 2
        if code not in CODE_DTYPES or ndim > MAX_NDIM or pos + 8 * ndim > len(view):
            raise FormatError(f"tensor {name!r}: bad dtype code or rank")
        shape = struct.unpack_from(f"<{ndim}Q", view, pos)
        pos += 8 * ndim
        dt = np.dtype(CODE_DTYPES[code]).newbyteorder("<")
        n = int(np.prod(shape, dtype=object)) if ndim else 1
        nbytes = n * dt.itemsize
        if pos + nbytes > len(view):
            raise FormatError(f"tensor {name!r}: data truncated")
        out[name] = np.frombuffer(view[pos : pos + nbytes], dtype=dt).reshape(shape).copy()
        pos += nbytes
    if pos != len(view):
        raise FormatError("trailing bytes after the last tensor")
    return out
