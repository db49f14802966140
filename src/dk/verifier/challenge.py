"""Challenge derivation and detection probability (SPEC §12.1).

``seed = H("dk/v1/challenge", transcript_root || beacon)``; the ``s`` uniform intervals are the
first ``s`` entries of a partial Fisher–Yates shuffle of ``range(m)`` driven by
``stream_key("challenge", 0, seed)``; then, per epoch (epoch of an interval = its start step
// steps per epoch), the ``q`` intervals with the largest claimed update norm (ties: lower
index) are added. The challenge is the sorted union.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from dk.crypto.hashing import TAG_CHALLENGE, tagged_hash
from dk.crypto.stream import sample_without_replacement, stream_key
from dk.pol.job import JobSpec


def challenge_seed(transcript_root: bytes, beacon: bytes) -> bytes:
    """The challenge seed (SPEC §12.1)."""
    return tagged_hash(TAG_CHALLENGE, transcript_root, beacon)


def derive_challenge(
    transcript_root: bytes,
    beacon: bytes,
    norms: Sequence[float],
    epochs: Sequence[int],
    samples: int,
    topq: int,
) -> list[int]:
    """Indices of the challenged intervals (sorted, distinct)."""
    m = len(norms)
    s = min(samples, m)
    seed = challenge_seed(transcript_root, beacon)
    chosen = set(sample_without_replacement(stream_key("challenge", 0, seed), m, s))
    if topq > 0:
        by_epoch: dict[int, list[int]] = defaultdict(list)
        for i, e in enumerate(epochs):
            by_epoch[e].append(i)
        for idx in by_epoch.values():
            chosen.update(sorted(idx, key=lambda i: (-norms[i], i))[:topq])
    return sorted(chosen)


def detection_probability(m: int, s: int, skipped_fraction: float) -> float:
    """P(at least one of ``s`` uniform samples without replacement hits a skipped interval)
    when ``ceil(f·m)`` of ``m`` intervals were skipped (hypergeometric)."""
    d = min(m, math.ceil(skipped_fraction * m - 1e-12))
    s = min(s, m)
    if d <= 0 or s <= 0:
        return 0.0
    if s > m - d:
        return 1.0
    miss = 1.0
    for i in range(s):
        miss *= (m - d - i) / (m - i)
    return 1.0 - miss


def samples_for(m: int, skipped_fraction: float, target: float) -> int:
    """Smallest ``s`` whose detection probability reaches ``target`` (``m`` if none does)."""
    for s in range(0, m + 1):
        if detection_probability(m, s, skipped_fraction) >= target:
            return s
    return m


# -- challenge documents (``dk challenge`` → ``dk prove --respond``) ---------------------------

CHALLENGE_FORMAT = "dk-challenge"
CHALLENGE_VERSION = 1
MAX_CHALLENGE_BYTES = 1024 * 1024
_CHALLENGE_KEYS = {"format", "version", "job_id", "transcript_root", "beacon", "intervals"}


def challenge_document(report: object) -> dict[str, object]:
    """The challenge a verifier hands the worker, from a ``replay=False`` report (SPEC IV §6.1)."""
    return {
        "format": CHALLENGE_FORMAT,
        "version": CHALLENGE_VERSION,
        "job_id": report.job_id,  # type: ignore[attr-defined]
        "transcript_root": report.transcript_root,  # type: ignore[attr-defined]
        "beacon": report.beacon,  # type: ignore[attr-defined]
        "intervals": list(report.challenged),  # type: ignore[attr-defined]
    }


def parse_challenge(data: bytes) -> dict[str, object]:
    """Parse a challenge document strictly (bounded, exact keys, hex fields, sorted intervals)."""
    from dk.crypto.canonical_json import parse_json
    from dk.crypto.hashing import parse_hex_digest
    from dk.errors import FormatError

    doc = parse_json(data, limit=MAX_CHALLENGE_BYTES, what="challenge")
    if not isinstance(doc, dict) or set(doc) != _CHALLENGE_KEYS:
        raise FormatError(f"challenge must have exactly the keys {sorted(_CHALLENGE_KEYS)}")
    if doc["format"] != CHALLENGE_FORMAT or doc["version"] != CHALLENGE_VERSION:
        raise FormatError("not a dk challenge (format/version)")
    for k in ("job_id", "transcript_root", "beacon"):
        parse_hex_digest(doc[k], what=f"challenge {k}")
    iv = doc["intervals"]
    if (
        not isinstance(iv, list)
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in iv)
        or iv != sorted(set(iv))
    ):
        raise FormatError("challenge intervals must be sorted distinct non-negative integers")
    return doc


def write_challenge(report: object, out: str | os.PathLike[str]) -> dict[str, object]:
    """Write the challenge document of a ``replay=False`` report to ``out`` (atomically) and
    return it. It records the committed transcript root the challenge pins (SPEC IV §9.3)."""
    import json

    from dk.pol.run import atomic_write

    doc = challenge_document(report)
    atomic_write(Path(out), (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
    return doc


def pinned_challenge(
    challenge_file: str | os.PathLike[str] | None,
    job: JobSpec | str | Path,
    *,
    beacon: bytes | None,
    root: bytes | None,
) -> tuple[bytes | None, bytes | None]:
    """The beacon and pinned root for ``dk verify`` (SPEC §12.1): from a challenge document
    (which must be for ``job`` and agree with any ``beacon``/``root`` also given), or as given.

    Raises:
        FormatError: a malformed challenge, one for another job, or a contradicting option.
    """
    from dk.errors import FormatError
    from dk.pol.job import as_job
    from dk.verifier.files import read_bounded
    from dk.verifier.report import Reason

    if challenge_file is None:
        return beacon, root
    data = read_bounded(
        Path(challenge_file), MAX_CHALLENGE_BYTES, Reason.BUNDLE_NOT_FOUND, Reason.BUNDLE_NOT_FOUND
    )
    doc = parse_challenge(data)
    if doc["job_id"] != as_job(job).job_id.hex():
        raise FormatError("the challenge is for another job (job_id differs)")
    b, r = bytes.fromhex(str(doc["beacon"])), bytes.fromhex(str(doc["transcript_root"]))
    if (beacon is not None and beacon != b) or (root is not None and root != r):
        raise FormatError("--beacon/--root contradict the challenge file")
    return b, r
