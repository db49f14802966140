"""Moving a bundle to a market server: a plain tar of the bundle's own files, read strictly.

A bundle crosses the network as an uncompressed POSIX tar whose members are exactly the files
of a bundle directory (SPEC I §11.3): ``manifest.json``, ``signature.hex``,
``blobs/<64 hex>.safetensors``, ``proofs/<name>.json``, a rounded run's
``logs/<64 hex>.dkrl`` (Part VI §4) and a data-parallel run's ``ranks/<i>.bin`` and
``ranks/<i>.msg`` (§11.6). The server never trusts the archive:
:func:`unpack_bundle` accepts only regular-file members with those names, no duplicates, each
and all of them under a size bound, and writes them into a fresh directory it owns. Nothing in
the archive is executed or unpickled; links, devices, absolute paths and ``..`` are refused.
"""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

from dk.errors import FormatError

MAX_BUNDLE_BYTES = 1 << 30  # one archive, all members together
MAX_MEMBERS = 100_000
_NAME = re.compile(
    r"\A(?:manifest\.json|signature\.hex|blobs/[0-9a-f]{64}\.safetensors"
    r"|proofs/[A-Za-z0-9_.-]{1,128}\.json|logs/[0-9a-f]{64}\.dkrl|ranks/[0-9]{1,9}\.(?:bin|msg))\Z"
)


def bundle_files(bundle_dir: str | Path) -> list[str]:
    """The names (relative, ``/``-separated) of a bundle directory's own files, sorted."""
    root = Path(bundle_dir)
    names = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            rel = p.relative_to(root).as_posix()
            if _NAME.match(rel):
                names.append(rel)
    return names


def pack_bundle(bundle_dir: str | Path) -> bytes:
    """A tar of the bundle's files (deterministic: sorted names, zero times and ids).

    Raises:
        FormatError: if the directory holds no ``manifest.json``.
    """
    root = Path(bundle_dir)
    names = bundle_files(root)
    if "manifest.json" not in names:
        raise FormatError(f"{root} is not a bundle (no manifest.json)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            data = (root / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def unpack_bundle(data: bytes, dest: str | Path, *, limit: int = MAX_BUNDLE_BYTES) -> Path:
    """Check an uploaded bundle archive and write its files under ``dest`` (a new directory).

    Raises:
        FormatError: not a tar, a member that is not a regular file with a bundle name, a
            duplicate, more than ``limit`` bytes in all, or no ``manifest.json``.
    """
    if len(data) > limit:
        raise FormatError(f"bundle archive is over {limit} bytes")
    out = Path(dest)
    seen: set[str] = set()
    total = 0
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:")
    except tarfile.TarError as e:
        raise FormatError(f"bundle archive is not a tar: {e}") from None
    with tar:
        members = []
        for count, m in enumerate(tar):
            if count >= MAX_MEMBERS:
                raise FormatError(f"bundle archive has over {MAX_MEMBERS} members")
            if not m.isreg():
                raise FormatError(f"bundle archive member {m.name!r} is not a regular file")
            if not _NAME.match(m.name):
                raise FormatError(f"bundle archive member {m.name!r} is not a bundle file")
            if m.name in seen:
                raise FormatError(f"bundle archive has {m.name!r} twice")
            seen.add(m.name)
            total += m.size
            if total > limit:
                raise FormatError(f"bundle archive holds over {limit} bytes")
            members.append(m)
        if "manifest.json" not in seen:
            raise FormatError("bundle archive has no manifest.json")
        out.mkdir(parents=True, exist_ok=False)
        for m in members:
            src = tar.extractfile(m)
            assert src is not None  # regular files always have a stream
            target = out / m.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(src.read(m.size))
    return out
