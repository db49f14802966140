"""Validators of the data-parallel extension keys (SPEC §11.6) and the rank signature.

``ext.ranks`` (run): ``[{"rank": r, "worker_key": hex}]`` for ``r = 0 … W−1``, distinct keys.
``ext.rank_digests`` (interval): ``[hex(D_{0,i}), …, hex(D_{W−1,i})]`` (:mod:`dk.pol.parallel`).
``rank_signatures`` (manifest, not in the root): ``[hex(sig_0), …]``, each an Ed25519 signature
over :func:`rank_signing_digest`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dk.crypto.canonical_json import parse_json
from dk.crypto.hashing import TAG_RANK, tagged_hash, u64
from dk.errors import FormatError

MAX_RANKS = 1024
RANK_SIGNATURES = "rank_signatures.json"  # in a run directory, written last (SPEC §11.6)
RANK_STEPS_DIR = "ranks"  # ranks/<i>.bin: step digests of interval i (run and bundle)
#: Tolerant mode: ranks/<i>.msg, the interval's messages, rank-major (SPEC §11.6).
RANK_MESSAGES_SUFFIX = ".msg"
_HEX = frozenset("0123456789abcdef")


def _is_hex(v: Any, n: int) -> bool:
    return isinstance(v, str) and len(v) == 2 * n and set(v) <= _HEX


def check_ranks(value: Any, where: str) -> None:
    """``ext.ranks``: 2 … 1024 entries ``{"rank": r, "worker_key": hex}``, rank = position,
    32-byte keys, pairwise distinct."""
    if not isinstance(value, list) or not 2 <= len(value) <= MAX_RANKS:
        raise ValueError(f"{where} must be a list of 2 to {MAX_RANKS} ranks")
    keys = set()
    for r, entry in enumerate(value):
        if not isinstance(entry, dict) or set(entry) != {"rank", "worker_key"}:
            raise ValueError(f"{where}[{r}] must have exactly keys rank, worker_key")
        if entry["rank"] != r or isinstance(entry["rank"], bool):
            raise ValueError(f"{where}[{r}] has rank {entry['rank']!r}")
        if not _is_hex(entry["worker_key"], 32):
            raise ValueError(f"{where}[{r}].worker_key must be 64 lowercase hex characters")
        keys.add(entry["worker_key"])
    if len(keys) != len(value):
        raise ValueError(f"{where} names a worker key twice")


def check_rank_digests(value: Any, where: str) -> None:
    """``ext.rank_digests``: 2 … 1024 digests, each 64 lowercase hex characters."""
    if not isinstance(value, list) or not 2 <= len(value) <= MAX_RANKS:
        raise ValueError(f"{where} must be a list of 2 to {MAX_RANKS} digests")
    for r, d in enumerate(value):
        if not _is_hex(d, 32):
            raise ValueError(f"{where}[{r}] must be 64 lowercase hex characters")


def check_rank_signatures(value: Any) -> str | None:
    """The manifest's ``rank_signatures`` list, structurally; a message if malformed."""
    if not isinstance(value, list) or not 2 <= len(value) <= MAX_RANKS:
        return f"rank_signatures must be a list of 2 to {MAX_RANKS} signatures"
    if not all(_is_hex(s, 64) for s in value):
        return "each rank signature must be 128 lowercase hex characters"
    return None


def rank_signing_digest(job_id: bytes, root: bytes, rank: int, worker_key: bytes) -> bytes:
    """What rank ``rank`` signs: ``H("dk/v2/rank", job_id || root || u64(rank) || key)``."""
    return tagged_hash(TAG_RANK, job_id, root, u64(rank), worker_key)


def read_rank_signatures(run_dir: str | Path) -> dict[str, Any]:
    """``RUN/rank_signatures.json`` (bounded, strict); a one-line error when absent."""
    p = Path(run_dir) / RANK_SIGNATURES
    if not p.is_file():
        raise FormatError(
            f"run {run_dir} has no {RANK_SIGNATURES}: a data-parallel run is complete only "
            "when every rank has signed it (did a rank fail?)"
        )
    with open(p, "rb") as f:
        data = f.read(1 << 20)
    doc = parse_json(data, limit=1 << 20, what=RANK_SIGNATURES)
    if not isinstance(doc, dict) or not isinstance(doc.get("rank_signatures"), list):
        raise FormatError(f"{p} is malformed")
    return doc
