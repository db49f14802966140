"""The structured reference string: locally generated, or a supplied file pinned by SHA-256.

SPEC IV §5. dk never downloads an SRS. By default it generates one with EZKL's
``gen_srs`` (fresh randomness; whoever generated it could forge proofs, so every proof made
with it carries the ``insecure-srs`` flag) and keeps it in the work directory for reuse.
An SRS file can be supplied instead, pinned by its SHA-256; it is labelled ``local`` unless
the caller says it comes from a ceremony. Which SRS a verifier accepts is named by the job.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from dk.circuits.reasons import CircuitError

MAX_LOGROWS = 26


@dataclass(frozen=True)
class Srs:
    """An SRS file ready for EZKL.

    Attributes:
        path: the file.
        sha256: hex SHA-256 of its bytes.
        kind: ``"local"`` (generated here, insecure) or ``"ceremony"`` (supplied, pinned).
    """

    path: Path
    sha256: str
    kind: str

    @property
    def insecure(self) -> bool:
        """True for a locally generated SRS."""
        return self.kind == "local"


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def local_srs(directory: Path, logrows: int) -> Srs:
    """Return the work directory's local SRS for ``logrows``, generating it on first use.

    Args:
        directory: where local SRS files live (created if missing).
        logrows: log2 of the circuit's row count.

    Returns:
        The local SRS (kind ``"local"``).
    """
    import ezkl

    if not 1 <= logrows <= MAX_LOGROWS:
        raise CircuitError(f"circuit: logrows {logrows} out of range")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"local-k{logrows}.srs"
    if not path.exists():
        tmp = directory / f".local-k{logrows}.{os.getpid()}.tmp"
        ezkl.gen_srs(str(tmp), logrows)
        try:
            # First writer wins: a second process must not swap in a different SRS under
            # keys (and proofs) already made with the first one.
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return Srs(path=path, sha256=file_sha256(path), kind="local")


def pinned_srs(path: str | Path, sha256: str | None, kind: str = "local") -> Srs:
    """Accept a supplied SRS file, checking it against its pinned SHA-256.

    Args:
        path: the SRS file.
        sha256: the expected hex SHA-256; required, so that a swapped file is refused.
        kind: ``"local"`` (default: someone's locally generated SRS, e.g. the one a worker
            proved with, shipped next to the proofs: usable, but flagged ``insecure-srs``) or
            ``"ceremony"`` (the caller vouches that it comes from a ceremony). The label never
            decides acceptance: the job names the SRS it accepts (SPEC IV §5).

    Returns:
        The SRS.

    Raises:
        CircuitError: when no pin is given, the file is missing or its hash differs.
    """
    p = Path(path)
    if kind not in ("ceremony", "local"):
        raise ValueError(f"unknown SRS kind {kind!r}")
    if not sha256:
        raise CircuitError("circuit: a supplied SRS must be pinned by its SHA-256")
    if not p.is_file():
        raise CircuitError(f"circuit: SRS file {p} not found")
    got = file_sha256(p)
    if got != sha256.lower():
        raise CircuitError(
            f"circuit: SRS {p} has SHA-256 {got}, pinned {sha256.lower()}",
            reason="ZK_SRS_MISMATCH",
        )
    return Srs(path=p, sha256=got, kind=kind)
