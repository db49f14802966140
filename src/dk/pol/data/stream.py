"""The data stream and its Merkle root (SPEC §7.1).

Every dataset, whatever its files, has one canonical byte stream::

    stream = "DKD1" || u32(len(meta)) || meta || payload

``meta`` is canonical JSON (SPEC §1.3) describing the layout and ``payload`` the samples' bytes
(per format, SPEC §7.2-§7.4). The data root is the Merkle root (SPEC §3) whose leaf data are the
stream's consecutive 65 536-byte chunks, like a checkpoint's (SPEC §4.2). Chunk leaves (not one
leaf per sample) make the commitment cost one SHA-256 pass over the bytes: chunks are sliced out
of memory-mapped files without copying and hashed on threads (hashlib releases the GIL on large
inputs), so the root of a gigabyte costs about what ``hashlib.sha256`` of it costs.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from dk.crypto.canonical_json import canonical_json
from dk.crypto.hashing import TAG_LEAF, tagged_hasher
from dk.crypto.merkle import merkle_root

MAGIC = b"DKD1"
CHUNK_SIZE = 65_536
MAX_META_BYTES = 64 * 1024 * 1024
_WINDOW = 512  # chunks handed to the hashing threads at a time (32 MiB)

Buffer = bytes | bytearray | memoryview | np.ndarray


def stream_prefix(meta: dict[str, Any]) -> bytes:
    """``"DKD1" || u32(len(meta)) || meta`` for a layout object (SPEC §7.1)."""
    raw = canonical_json(meta)
    if len(raw) > MAX_META_BYTES:
        raise ValueError(f"data layout over {MAX_META_BYTES} bytes")
    return MAGIC + struct.pack("<I", len(raw)) + raw


def as_bytes_view(buf: Buffer) -> memoryview:
    """A flat byte view of a buffer (a C-contiguous array or a bytes-like), without copying."""
    if isinstance(buf, np.ndarray):
        flat = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
        return memoryview(flat.data).cast("B")
    return memoryview(buf).cast("B")


def iter_chunks(segments: Iterable[Buffer], size: int = CHUNK_SIZE) -> Iterator[bytes | memoryview]:
    """Consecutive ``size``-byte chunks of the concatenated segments (the last one shorter).

    Whole chunks inside one segment are zero-copy slices; a chunk that straddles segments is
    joined into a new ``bytes``. Empty segments are skipped; an empty stream yields nothing.
    """
    pending = bytearray()
    for seg in segments:
        mv = as_bytes_view(seg)
        off = 0
        if pending:
            take = min(size - len(pending), len(mv))
            pending += mv[:take]
            off = take
            if len(pending) < size:
                continue
            yield bytes(pending)
            pending = bytearray()
        end = off + (len(mv) - off) // size * size
        for o in range(off, end, size):
            yield mv[o : o + size]
        pending += mv[end:]
    if pending:
        yield bytes(pending)


def _hash_leaves(chunks: list[bytes | memoryview]) -> list[bytes]:
    base = tagged_hasher(TAG_LEAF)
    out = []
    for c in chunks:
        h = base.copy()
        h.update(c)
        out.append(h.digest())
    return out


def default_threads() -> int:
    """Hashing threads: ``DK_DATA_THREADS`` or the CPU count, at most 16."""
    env = os.environ.get("DK_DATA_THREADS")
    if env:
        return max(1, int(env))
    return max(1, min(16, os.cpu_count() or 1))


def stream_root(segments: Iterable[Buffer], *, threads: int | None = None) -> bytes:
    """Merkle root over the 64 KiB chunks of the concatenated segments (SPEC §7.1)."""
    n = default_threads() if threads is None else max(1, threads)
    leaves: list[bytes] = []
    window: list[bytes | memoryview] = []
    pool = ThreadPoolExecutor(n) if n > 1 else None
    try:

        def flush() -> None:
            if pool is None or len(window) < 2 * n:
                leaves.extend(_hash_leaves(window))
            else:
                step = -(-len(window) // n)
                parts = [window[i : i + step] for i in range(0, len(window), step)]
                for part in pool.map(_hash_leaves, parts):
                    leaves.extend(part)
            window.clear()

        for chunk in iter_chunks(segments):
            window.append(chunk)
            if len(window) >= _WINDOW:
                flush()
        flush()
    finally:
        if pool is not None:
            pool.shutdown()
    return merkle_root(leaves)
