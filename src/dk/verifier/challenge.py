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


def miss_probability(m: int, d: int, s: int) -> float:
    """``C(m−d, s) / C(m, s)``: no one of ``s`` uniform samples without replacement hits one
    of ``d`` skipped intervals, as ``Π_{i<s} (m−d−i)/(m−i)`` in binary64 in that order."""
    if d <= 0:
        return 1.0
    if s > m - d:
        return 0.0
    miss = 1.0
    for i in range(s):
        miss *= (m - d - i) / (m - i)
    return miss


def detection_probability(m: int, s: int, skipped_fraction: float) -> float:
    """P(at least one of ``s`` uniform samples without replacement hits a skipped interval)
    when ``ceil(f·m)`` of ``m`` intervals were skipped (hypergeometric)."""
    d = min(m, math.ceil(skipped_fraction * m - 1e-12))
    s = min(s, m)
    if d <= 0 or s <= 0:
        return 0.0
    return 1.0 - miss_probability(m, d, s)


def samples_for(m: int, skipped_fraction: float, target: float) -> int:
    """Smallest ``s`` whose detection probability reaches ``target`` (``m`` if none does)."""
    for s in range(0, m + 1):
        if detection_probability(m, s, skipped_fraction) >= target:
            return s
    return m


# -- challenge documents (``dk challenge`` → ``dk prove --respond``) ---------------------------

# The document format lives in dk.pol.challenge_doc, below the prover and the verifier, so
# the prover reads challenges without importing the verifier (DESIGN §3).
from dk.pol.challenge_doc import (  # noqa: E402
    _CHALLENGE_KEYS as _CHALLENGE_KEYS,
)
from dk.pol.challenge_doc import (  # noqa: E402
    CHALLENGE_FORMAT as CHALLENGE_FORMAT,
)
from dk.pol.challenge_doc import (  # noqa: E402
    CHALLENGE_VERSION as CHALLENGE_VERSION,
)
from dk.pol.challenge_doc import (  # noqa: E402
    MAX_CHALLENGE_BYTES as MAX_CHALLENGE_BYTES,
)
from dk.pol.challenge_doc import challenge_document as challenge_document  # noqa: E402
from dk.pol.challenge_doc import parse_challenge as parse_challenge  # noqa: E402


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
