"""A cache of data roots keyed by file identity (SPEC §7.6).

Computing the root of a large dataset reads every byte; a second run on unchanged files should
not. The cache maps a *file identity* to the root and holds nothing else:

    key = SHA-256(canonical_json({"layout": tag, "files": [[path, size, mtime_ns, ctime_ns,
                                                            inode, device], ...]}))

``path`` is absolute and resolved, ``tag`` names the format and every parameter that changes
the root (e.g. the token dtype). Any change to a file (its bytes through size, mtime or ctime;
its replacement through inode or device) changes the key, so a changed file is never trusted:
the root is recomputed. ``ctime`` cannot be set by ``touch`` or ``os.utime``, so restoring a
file's mtime after editing it does not fool the cache. Entries are files named by the key's hex
under ``$DK_CACHE_DIR/data-roots`` (default ``~/.cache/dk/data-roots``) holding the 64-hex
root; ``DK_DATA_CACHE=0`` turns the cache off. Datasets under ``MIN_CACHED_BYTES`` are not
cached (hashing them costs milliseconds).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from dk.crypto.canonical_json import canonical_json

MIN_CACHED_BYTES = 16 * 1024 * 1024
_HEX = frozenset("0123456789abcdef")


def cache_dir() -> Path:
    """``$DK_CACHE_DIR/data-roots`` or ``~/.cache/dk/data-roots``."""
    env = os.environ.get("DK_CACHE_DIR")
    return (Path(env) if env else Path.home() / ".cache" / "dk") / "data-roots"


def enabled() -> bool:
    """False when ``DK_DATA_CACHE`` is ``0``, ``off`` or ``no``."""
    return os.environ.get("DK_DATA_CACHE", "1").lower() not in ("0", "off", "no", "false")


def identity_key(tag: str, files: Sequence[Path]) -> tuple[str, int]:
    """The cache key (hex) of these files under this layout tag, and their total size."""
    rows = []
    total = 0
    for f in files:
        p = Path(f).resolve()
        st = p.stat()
        total += st.st_size
        rows.append([str(p), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev])
    doc = canonical_json({"files": rows, "layout": tag})
    return hashlib.sha256(doc).hexdigest(), total


def lookup(key: str) -> bytes | None:
    """The cached root for ``key``, or None (a malformed entry counts as a miss)."""
    try:
        text = (cache_dir() / key).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if len(text) != 64 or not set(text) <= _HEX:
        return None
    return bytes.fromhex(text)


def store(key: str, root: bytes) -> None:
    """Record ``root`` under ``key`` (atomic rename; a failure to write is ignored)."""
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(root.hex() + "\n", encoding="ascii")
        os.replace(tmp, d / key)
    except OSError:
        pass
