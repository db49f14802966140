"""A run directory's blob pack: small checkpoints appended to one file (SPEC §11.8).

A run directory (the worker's own, never a bundle) keeps each checkpoint whose blob is at most
``PACK_MAX_BLOB`` bytes in ``blobs.pack`` instead of a file of its own: creating, writing and
closing one file per checkpoint costs more than hashing a small one (k = 5 on a small model
commits a checkpoint every few milliseconds). Layout (little-endian)::

    pack   = PACK_MAGIC || record*
    record = REC_MAGIC (4 bytes) || u32 0 || u64 nbytes || root (32 bytes) || blob (nbytes)

``blob`` is the checkpoint's safetensors bytes (SPEC §10.3), exactly the file a bundle holds
under ``blobs/<root>.safetensors``; ``root`` is its commitment (SPEC §4.2). Larger
checkpoints stay files ``blobs/<root>.safetensors`` (streamed, never held in memory twice),
and so does every blob of a run recorded before packs existed: :class:`RunBlobs` reads both.

* **Appended in batches.** The commit writer (:mod:`dk.pol.writer`) appends a batch of
  records with one write, then logs them: the log never names a record that is not whole.
* **The pack is its own index.** A reader walks the record headers once (one small read
  each); a header that is not a record, or a record running past the end of the file (a torn
  tail), ends the walk. Resuming cuts the pack back to the last record its log names.
* **Checked before use.** A record is used only if its header names the root and size the run
  lists, and its bytes parse as strict safetensors (bounded, never unpickled) whose tensors
  hash to that root; anything else is a :class:`~dk.errors.FormatError`, so ``dk prove``
  never signs a bundle over a blob the run did not commit.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterable
from pathlib import Path

from dk.crypto.hashing import digests_equal
from dk.errors import FormatError
from dk.pol.checkpoint import (
    MAX_BLOB_BYTES,
    Tensors,
    blob_name,
    checkpoint_root,
    parse_blob,
    read_blob_file,
)

__all__ = ["PackWriter", "RunBlobs", "pack_record", "read_run_checkpoint"]

PACK_NAME = "blobs.pack"
PACK_MAGIC = b"dk-pack\x01"
REC_MAGIC = b"dkB1"
_HEADER = struct.Struct("<4sIQ32s")
HEADER_BYTES = _HEADER.size  # 48
#: Blobs up to this size are packed; larger ones are files (SPEC §11.8).
PACK_MAX_BLOB = 16 * 1024 * 1024


def pack_record(root: bytes, nbytes: int) -> bytes:
    """The header of a record holding a blob of ``nbytes`` bytes committed to ``root``."""
    return _HEADER.pack(REC_MAGIC, 0, nbytes, root)


class PackWriter:
    """Appends records to a run's ``blobs.pack`` (one :class:`dk.pol.writer.CommitWriter`
    commit at a time, on the training thread or the writer's thread)."""

    def __init__(self, path: Path, *, fresh: bool) -> None:
        """Open ``path`` for appending; ``fresh`` starts an empty pack (a new run), else the
        pack a resumed run has (cut back to its log by :func:`dk.pol.resume.rewrite_log`)
        is continued, or created if the run had none (a run from before packs)."""
        self.path = path
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if fresh else 0)
        self._fd = os.open(path, flags, 0o644)
        try:
            size = os.fstat(self._fd).st_size
            if size == 0:
                self.write(PACK_MAGIC)
            else:
                with open(path, "rb") as f:
                    if f.read(len(PACK_MAGIC)) != PACK_MAGIC:
                        raise FormatError(f"{path} is not a dk blob pack")
        except BaseException:
            os.close(self._fd)
            raise

    def write(self, data: bytes) -> None:
        """Append ``data`` (whole records) with as few system calls as the OS allows."""
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        """Close the file (its bytes are made durable with the run, SPEC §11.8)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class RunBlobs:
    """The checkpoint blobs of a run directory: in its ``blobs.pack`` or ``blobs/`` files."""

    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)
        self._index: dict[bytes, tuple[int, int]] | None = None
        #: Offset just past the last whole record (where the pack may be cut back to).
        self.end = 0
        #: Where the walk stopped before the end of the file: a header that is not a record,
        #: or a record that does not fit (a torn tail, after a crash); ``None`` if it did not.
        self.damaged_at: int | None = None

    @property
    def pack_path(self) -> Path:
        """The run's ``blobs.pack`` (which may not exist)."""
        return self.dir / PACK_NAME

    def index(self) -> dict[bytes, tuple[int, int]]:
        """``root -> (offset of the blob, nbytes)`` of every whole record (walked once)."""
        if self._index is None:
            self._index = self._walk()
        return self._index

    def _walk(self) -> dict[bytes, tuple[int, int]]:
        out: dict[bytes, tuple[int, int]] = {}
        try:
            st = os.lstat(self.pack_path)
        except FileNotFoundError:
            return out
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"{self.pack_path} is not a regular file", reason="BAD_PATH")
        with open(self.pack_path, "rb") as f:
            fd, size = f.fileno(), os.fstat(f.fileno()).st_size
            if size == 0:  # created, then the process died before its first write
                return out
            if os.pread(fd, len(PACK_MAGIC), 0) != PACK_MAGIC:
                raise FormatError(f"{self.pack_path} is not a dk blob pack")
            pos = len(PACK_MAGIC)
            while pos + HEADER_BYTES <= size:
                magic, flags, n, root = _HEADER.unpack(os.pread(fd, HEADER_BYTES, pos))
                if magic != REC_MAGIC or flags != 0:
                    self.damaged_at = pos
                    break
                if n > PACK_MAX_BLOB or pos + HEADER_BYTES + n > size:
                    break  # a torn tail (or a size no blob has): the walk ends here
                out.setdefault(root, (pos + HEADER_BYTES, n))
                pos += HEADER_BYTES + n
            self.end = pos
            if self.damaged_at is None and pos < size:
                self.damaged_at = pos  # a record that does not fit (or a torn header)
        return out

    def has(self, root: bytes, nbytes: int) -> bool:
        """True when the blob of ``root`` is there with ``nbytes`` bytes (not yet checked)."""
        at = self.index().get(root)
        if at is not None:
            return at[1] == nbytes
        p = self.dir / blob_name(root)
        return p.is_file() and p.stat().st_size == nbytes

    def packed_end(self, roots: Iterable[bytes]) -> int:
        """Offset just past the last record of ``roots`` (the pack's magic if none is packed)."""
        idx = self.index()
        ends = [idx[r][0] + idx[r][1] for r in roots if r in idx]
        return max(ends, default=len(PACK_MAGIC))

    def read(self, root: bytes, nbytes: int | None = None) -> tuple[bytes, Tensors]:
        """The blob of ``root`` and its tensors, checked: strict safetensors, bounded, of
        ``nbytes`` bytes when given, hashing to ``root``.

        Raises:
            FormatError: the blob is missing, damaged, or not the checkpoint of ``root``.
        """
        at = self.index().get(root)
        where = f"{PACK_NAME} of {self.dir}" if at is not None else str(self.dir)
        if at is not None:
            off, n = at
            if nbytes is not None and n != nbytes:
                raise FormatError(
                    f"{where}: checkpoint {root.hex()[:16]}… has {n} bytes, the run lists {nbytes}",
                    reason="BLOB_MALFORMED",
                )
            with open(self.pack_path, "rb") as f:
                data = _pread_all(f.fileno(), n, off)
            if len(data) != n:
                raise FormatError(f"{where}: checkpoint {root.hex()[:16]}… is cut short")
        else:
            path = self.dir / blob_name(root)
            if not path.exists() and self.damaged_at is not None:
                raise FormatError(
                    f"{self.pack_path} is damaged at byte {self.damaged_at}: checkpoint "
                    f"{root.hex()[:16]}… cannot be read; re-record the run",
                    reason="BLOB_MISSING",
                )
            data = read_blob_file(path, limit=nbytes if nbytes is not None else MAX_BLOB_BYTES)
            if nbytes is not None and len(data) != nbytes:
                raise FormatError(
                    f"{path} has {len(data)} bytes, the run lists {nbytes}",
                    reason="BLOB_MALFORMED",
                )
        try:
            tensors = parse_blob(data)
        except FormatError as e:
            raise FormatError(
                f"{where}: checkpoint {root.hex()[:16]}… {e}", reason=e.reason
            ) from None
        if not digests_equal(checkpoint_root(tensors), root):
            raise FormatError(
                f"{where}: checkpoint {root.hex()[:16]}… does not hash to its root (the run "
                "directory is damaged; re-record the run)",
                reason="COMMITMENT_MISMATCH",
            )
        return data, tensors

    def checkpoint(self, root: bytes, nbytes: int | None = None) -> Tensors:
        """The checked tensors of the checkpoint committed to ``root`` (see :meth:`read`)."""
        return self.read(root, nbytes)[1]

    def export(self, root: bytes, nbytes: int, dst: Path) -> None:
        """Put the blob of ``root`` at ``dst`` (a bundle's ``blobs/<root>.safetensors``).

        A packed blob is checked (:meth:`read`) and written atomically; a blob file is
        hard-linked (copied where links fail), as runs before packs were proved. An existing
        ``dst`` is kept.
        """
        if dst.exists():
            return
        if root not in self.index():
            src = self.dir / blob_name(root)
            if src.is_file():
                _link_or_copy(src, dst)
                return
            if self.damaged_at is None:  # else read() says where the pack is damaged
                raise FormatError(f"run is missing blob {blob_name(root)}", reason="BLOB_MISSING")
        data, _ = self.read(root, nbytes)
        tmp = dst.with_name(f".tmp-{os.getpid()}-{dst.name}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def read_run_checkpoint(
    run_dir: str | Path, root: str | bytes, nbytes: int | None = None
) -> Tensors:
    """The checked tensors of one checkpoint of a run directory (packed or a file)."""
    r = bytes.fromhex(root) if isinstance(root, str) else root
    return RunBlobs(run_dir).checkpoint(r, nbytes)


def truncate_pack(run_dir: str | Path, end: int) -> None:
    """Cut ``blobs.pack`` back to ``end`` bytes (records past the log's last are dropped)."""
    p = Path(run_dir) / PACK_NAME
    if p.is_file() and p.stat().st_size > end:
        os.truncate(p, end)


def _pread_all(fd: int, n: int, off: int) -> bytes:
    parts, got = [], 0
    while got < n:
        b = os.pread(fd, min(n - got, 1 << 30), off + got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _link_or_copy(src: Path, dst: Path) -> None:
    import shutil

    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
