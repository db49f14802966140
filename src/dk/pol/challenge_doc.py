"""The challenge document (SPEC IV §9.3): what a verifier hands the worker after it fixed the
beacon. It sits in ``pol`` so that the prover (``dk prove --respond``) and the verifier both
read it without the prover importing the verifier (DESIGN §3)."""

from __future__ import annotations

from dk.crypto.canonical_json import parse_json
from dk.crypto.hashing import parse_hex_digest
from dk.errors import FormatError

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


def proof_file(interval: int) -> str:
    """Relative path of interval ``i``'s proof chain in a bundle (SPEC IV §6.2)."""
    return f"proofs/interval-{interval}.json"
