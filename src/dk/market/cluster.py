"""Cluster orders: the rules without the ledger (SPEC Part V §14).

An order may ask for a cluster of ``W`` workers (``world_size``, from the job's
``[train] world_size``; a job without it is ``W = 1``, the ordinary flow). This module holds
the pure rules every party recomputes: the payment shares (by the samples each rank
processed under the global-batch split rule), the message each rank signs over the
transcript root, reading the ranks from a bundle's manifest, and reading the verifier's
``blame``. The ledger side is :mod:`dk.market.cluster_flow`; the audit's is
:mod:`dk.market.cluster_audit`.
"""

from __future__ import annotations

from typing import Any

from dk.crypto.hashing import tagged_hash, u64
from dk.crypto.keys import SigningKey, VerifyKey
from dk.errors import FormatError
from dk.market import fields

TAG_RANK = "dk/v2/rank"
MAX_WORLD = 64


def world_size_param(params: dict[str, Any]) -> int:
    """The ``world_size`` of an ``order`` request: an integer in ``[1, 64]``, default 1.

    Raises:
        FormatError: ``BAD_PARAMS``.
    """
    if "world_size" not in params:
        return 1
    return fields.integer(params, "world_size", 1, MAX_WORLD)


def job_world_size(job: Any) -> int:
    """``[train] world_size`` of a job (1 when the job has none)."""
    train = getattr(job, "train", None)
    value = train.get("world_size", 1) if isinstance(train, dict) else 1
    return int(value)


def job_batch_size(job: Any) -> int:
    """``[train] batch_size`` of a job: the global batch the ranks split.

    Raises:
        FormatError: if the job has no positive batch size.
    """
    train = getattr(job, "train", None)
    value = train.get("batch_size") if isinstance(train, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise FormatError("the job has no train.batch_size to split across ranks")
    return value


def sample_counts(world_size: int, batch_size: int) -> list[int]:
    """Samples of one global batch each rank processes: rank ``r`` takes the positions
    ``p < batch_size`` with ``p mod world_size == r`` (SPEC Part V §14.3)."""
    return [len(range(r, batch_size, world_size)) for r in range(world_size)]


def rank_shares(price: int, world_size: int, batch_size: int) -> list[int]:
    """Each rank's payment out of ``price`` (SPEC Part V §14.3).

    ``share_r = floor(price * n_r / batch_size)`` with ``n_r`` from :func:`sample_counts`
    (every step splits the same way, so the number of steps cancels); the remainder
    ``price - sum(share_r)`` goes to rank 0. The shares sum to ``price`` exactly.

    Examples:
        >>> rank_shares(100, 3, 32)
        [34, 33, 33]
        >>> rank_shares(7, 2, 4)
        [4, 3]
    """
    if world_size < 1 or batch_size < 1 or price < 0:
        raise ValueError("rank_shares needs world_size >= 1, batch_size >= 1, price >= 0")
    shares = [price * n // batch_size for n in sample_counts(world_size, batch_size)]
    shares[0] += price - sum(shares)
    return shares


def rank_message(job_id: bytes, transcript_root: bytes, rank: int, worker_key: bytes) -> bytes:
    """The 32-byte message rank ``rank`` signs (SPEC Part V §14.4)::

    H("dk/v2/rank", job_id || transcript_root || u64(rank) || worker_key)
    """
    return tagged_hash(TAG_RANK, job_id, transcript_root, u64(rank), worker_key)


def manifest_ranks(manifest: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The ranks' worker keys and signatures of a W-rank bundle's manifest (rank order).

    Reads the run's extension ``"ext": {"ranks": [{"rank": r, "worker_key": HEX32}]}``
    (``r = 0..W-1`` in order; Part I §11.6) and the top-level ``"rank_signatures": [HEX64,
    ...]`` (one per rank); rank 0's key must be the manifest's ``worker_key``. A minimal
    reader: the verifier parses and checks the rest of the bundle.

    Raises:
        FormatError: if either list is missing or malformed.
    """
    ext = manifest.get("ext")
    ranks = ext.get("ranks") if isinstance(ext, dict) else None
    sigs = manifest.get("rank_signatures")
    if not isinstance(ranks, list) or not 1 <= len(ranks) <= MAX_WORLD:
        raise FormatError(f"manifest ranks must list 1..{MAX_WORLD} ranks")
    if not isinstance(sigs, list) or len(sigs) != len(ranks):
        raise FormatError("manifest rank_signatures must hold one signature per rank")
    keys: list[str] = []
    for r, entry in enumerate(ranks):
        if not isinstance(entry, dict) or set(entry) != {"rank", "worker_key"}:
            raise FormatError(f"manifest rank {r} must have exactly rank and worker_key")
        if entry["rank"] != r or isinstance(entry["rank"], bool):
            raise FormatError(f"manifest ranks must be listed in order (entry {r})")
        keys.append(fields.digest_hex(entry, "worker_key"))
    for r, sig in enumerate(sigs):
        if not isinstance(sig, str) or len(sig) != 128:
            raise FormatError(f"manifest rank signature {r} must be 128 hex characters")
    if keys[0] != manifest.get("worker_key"):
        raise FormatError("manifest rank 0 must be its worker_key")
    return keys, list(sigs)


def bad_rank_signatures(manifest: dict[str, Any]) -> list[int]:
    """The ranks whose signature over the transcript root does not verify (SPEC V §14.4).

    Raises:
        FormatError: if the ranks are malformed (:func:`manifest_ranks`).
    """
    keys, sigs = manifest_ranks(manifest)
    job_id = bytes.fromhex(fields.digest_hex(manifest, "job_id"))
    root = bytes.fromhex(fields.digest_hex(manifest, "transcript_root"))
    bad = []
    for r, (key, sig) in enumerate(zip(keys, sigs, strict=True)):
        try:
            ok = VerifyKey.from_hex(key).verify(
                bytes.fromhex(sig), rank_message(job_id, root, r, bytes.fromhex(key))
            )
        except (FormatError, ValueError):
            ok = False
        if not ok:
            bad.append(r)
    return bad


def blame_of(result: Any, world_size: int) -> list[int] | None:
    """The ranks a verifier's report or replay result blames (SPEC V §14.5).

    Reads ``result.blame``: absent or None is ``[]`` (not attributable). Returns the sorted
    ranks, or None when ``blame`` is malformed (not a list of distinct integers in
    ``[0, world_size)``): a verifier's own fault, which the market treats as inconclusive.
    """
    blame = getattr(result, "blame", None)
    if blame is None:
        return []
    if not isinstance(blame, list | tuple):
        return None
    out = set()
    for r in blame:
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < world_size or r in out:
            return None
        out.add(r)
    return sorted(out)


def guilty_ranks(blame: list[int] | None, world_size: int) -> list[int]:
    """Whose stake a proven fault takes (SPEC V §14.5): the blamed ranks; every rank when
    ``blame`` is None (a cluster that never delivered); rank 0 when the fault is proven but
    names no rank (``[]``: rank 0 assembled and signed the bundle)."""
    if blame is None:
        return list(range(world_size))
    return blame or [0]


def rank_signature(key: SigningKey, job_id: bytes, transcript_root: bytes, rank: int) -> str:
    """Rank ``rank``'s signature (128 hex) over the transcript root with its worker key (the
    prover's side of §14.4; here for tests, vectors and the demo's bundle assembly)."""
    return key.sign(rank_message(job_id, transcript_root, rank, key.verify_key.raw)).hex()
