"""Domain-separated SHA-256 hashing (SPEC §2).

Every hash dk computes is ``tagged_hash(tag, data)``::

    SHA-256( u8(len(tag)) || tag || data )

with ``tag`` an ASCII string from the table in SPEC §2. The one-byte length prefix makes the
tag boundary unambiguous, so no two (tag, data) pairs share a preimage.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

DIGEST_SIZE = 32

# SPEC §2: the complete list of tags. Code never spells a tag literal elsewhere.
TAG_LEAF = "dk/v1/merkle/leaf"
TAG_NODE = "dk/v1/merkle/node"
TAG_EMPTY = "dk/v1/merkle/empty"
TAG_SAMPLE = "dk/v1/data/sample"
TAG_JOB = "dk/v1/job"
TAG_BATCH = "dk/v1/batch"
TAG_TRANSCRIPT_HEADER = "dk/v1/transcript/header"
TAG_TRANSCRIPT_LEAF = "dk/v1/transcript/leaf"
TAG_TRANSCRIPT_EXT = "dk/v1/transcript/ext"
TAG_SIGNATURE = "dk/v1/signature"
TAG_CHALLENGE = "dk/v1/challenge"
TAG_STREAM = "dk/v1/stream"
TAG_ATTESTATION = "dk/v1/attestation"
TAG_REPORT = "dk/v1/report"
TAG_RANK = "dk/v2/rank"  # a rank's signature over the transcript root (SPEC §11.6)
TAG_RANK_GRAD = "dk/v2/rank/grad"  # one rank's gradient message of one step (SPEC §11.6)
TAG_RANK_INTERVAL = "dk/v2/rank/interval"  # one rank's digest of one interval (SPEC §11.6)


def _prefix(tag: str) -> bytes:
    raw = tag.encode("ascii")
    if not 0 < len(raw) < 256:
        raise ValueError(f"tag must be 1..255 ASCII bytes, got {len(raw)}")
    return bytes([len(raw)]) + raw


def tagged_hasher(tag: str) -> hashlib._Hash:
    """Return a SHA-256 object already fed with the tag prefix (for streaming input)."""
    h = hashlib.sha256()
    h.update(_prefix(tag))
    return h


def tagged_hash(tag: str, *parts: bytes | bytearray | memoryview) -> bytes:
    """Hash the concatenation of ``parts`` under ``tag`` (SPEC §2).

    >>> tagged_hash("dk/v1/job", b"").hex()[:16]
    'c81c5c5ded769744'
    """
    h = tagged_hasher(tag)
    for p in parts:
        h.update(p)
    return h.digest()


def u64(n: int) -> bytes:
    """Little-endian unsigned 64-bit encoding."""
    return struct.pack("<Q", n)


def f64(x: float) -> bytes:
    """Little-endian IEEE-754 binary64 encoding."""
    return struct.pack("<d", x)


def digests_equal(a: bytes, b: bytes) -> bool:
    """Compare two digests in constant time."""
    return hmac.compare_digest(bytes(a), bytes(b))


def parse_hex_digest(value: object, *, what: str = "digest", nbytes: int = DIGEST_SIZE) -> bytes:
    """Parse a ``2 * nbytes``-character lowercase hex string (default: a 32-byte digest) into
    bytes, or raise ``FormatError``. The one hex check of dk."""
    from dk.errors import FormatError

    if not isinstance(value, str) or len(value) != 2 * nbytes:
        raise FormatError(f"{what} must be a {2 * nbytes}-character hex string")
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise FormatError(f"{what} is not valid hex") from None
    if raw.hex() != value:
        raise FormatError(f"{what} must be lowercase hex")
    return raw
