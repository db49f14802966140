"""A bundle as one byte string, for Flower's fit metrics (SPEC §VII.1).

Layout: ``b"DKB1"``, then per file ``u16 name length || name (UTF-8) || u64 size || bytes``.
Names MUST be ``manifest.json``, ``signature.hex`` or ``blobs/<64 hex>.safetensors``; each name
at most once; the whole at most ``MAX_PACKED_BYTES``. Unpacking writes regular files into a
fresh directory only; it never follows a path from the input.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

from dk.errors import FormatError

MAGIC = b"DKB1"
MAX_PACKED_BYTES = 256 * 1024 * 1024
_NAME = re.compile(r"^(manifest\.json|signature\.hex|blobs/[0-9a-f]{64}\.safetensors)$")


def pack_bundle(bundle: Path) -> bytes:
    """The bundle directory as bytes (files in sorted name order)."""
    names = ["manifest.json", "signature.hex"]
    names += sorted(f"blobs/{p.name}" for p in (bundle / "blobs").iterdir())
    out = [MAGIC]
    for name in names:
        data = (bundle / name).read_bytes()
        raw = name.encode()
        out += [struct.pack(">H", len(raw)), raw, struct.pack(">Q", len(data)), data]
    packed = b"".join(out)
    if len(packed) > MAX_PACKED_BYTES:
        raise FormatError(f"bundle is over {MAX_PACKED_BYTES} bytes packed")
    return packed


def unpack_bundle(data: bytes, dest: Path) -> Path:
    """Write packed bundle bytes into the new directory ``dest``; returns it.

    Raises:
        FormatError: bad magic, truncation, a name outside the allowed set, a duplicate, or
            over the size limit.
    """
    if not isinstance(data, bytes) or len(data) > MAX_PACKED_BYTES or data[:4] != MAGIC:
        raise FormatError("not a packed dk bundle", reason="BUNDLE_MALFORMED")
    dest.mkdir(parents=True)
    (dest / "blobs").mkdir()
    pos, seen = 4, set()
    while pos < len(data):
        if pos + 2 > len(data):
            raise FormatError("packed bundle truncated", reason="BUNDLE_MALFORMED")
        (n,) = struct.unpack_from(">H", data, pos)
        name = data[pos + 2 : pos + 2 + n].decode("utf-8", "replace")
        pos += 2 + n
        if not _NAME.match(name) or name in seen:
            raise FormatError(f"packed bundle names {name!r}", reason="BUNDLE_MALFORMED")
        if pos + 8 > len(data):
            raise FormatError("packed bundle truncated", reason="BUNDLE_MALFORMED")
        (size,) = struct.unpack_from(">Q", data, pos)
        pos += 8
        if pos + size > len(data):
            raise FormatError("packed bundle truncated", reason="BUNDLE_MALFORMED")
        seen.add(name)
        (dest / name).write_bytes(data[pos : pos + size])
        pos += size
    if not {"manifest.json", "signature.hex"} <= seen:
        raise FormatError(
            "packed bundle lacks its manifest or signature", reason="BUNDLE_MALFORMED"
        )
    return dest
