"""The transcript: its leaves and root, the bundle manifest, and the signed digest (SPEC §11).

Transcript leaves (each a 32-byte tagged hash, then hashed as a Merkle leaf)::

    header  = H("dk/v1/transcript/header", job_id || worker_key || data_root
                || u64(k) || u64(steps) || u64(m + 1) || ext(run))
    leaf_j  = H("dk/v1/transcript/leaf", u64(j) || u64(step_j) || root_j
                || batch_commitment_j || f64(update_norm_j) || ext(interval_{j-1}))  j = 0..m

where ``batch_commitment_j`` and ``update_norm_j`` describe interval ``j - 1`` (the one ending at
checkpoint ``j``; 32 zero bytes and 0.0 for ``j = 0``). ``transcript_root`` is the Merkle root
over ``[header, leaf_0, …, leaf_m]``. The worker signs
``H("dk/v1/signature", job_id || transcript_root || worker_key)`` with Ed25519.

``ext(x)`` is the digest of the optional ``ext`` object of the run or of an interval (SPEC
§11.5): 32 zero bytes when there is none, else ``H("dk/v1/transcript/ext", canonical_json(ext))``.
Which keys an ``ext`` object may hold, and their values, is fixed by :data:`RUN_EXTENSIONS` and
:data:`INTERVAL_EXTENSIONS`; any other key is ``MANIFEST_MALFORMED``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

from dk.crypto.canonical_json import canonical_json, encode_parsed, parse_json
from dk.crypto.hashing import (
    TAG_SIGNATURE,
    TAG_TRANSCRIPT_EXT,
    TAG_TRANSCRIPT_HEADER,
    TAG_TRANSCRIPT_LEAF,
    f64,
    parse_hex_digest,
    tagged_hash,
    u64,
)
from dk.crypto.merkle import leaf_hash, merkle_root
from dk.errors import FormatError
from dk.pol.loss import LOSS_KEY, check_loss_value
from dk.pol.rank_ext import check_rank_digests, check_rank_signatures, check_ranks

BUNDLE_FORMAT = "dk-pol-bundle"
BUNDLE_VERSION = 2
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_CHECKPOINTS = 100_000
ZERO32 = bytes(32)

_TOP_KEYS = {
    "format",
    "version",
    "job_id",
    "worker_key",
    "data_root",
    "interval",
    "steps",
    "chunk_size",
    "checkpoints",
    "intervals",
    "transcript_root",
}
_OPTIONAL_TOP = {"proofs", "ext", "rank_signatures"}
_CK_KEYS = {"index", "step", "root", "blob", "nbytes"}
_IV_KEYS = {"index", "start_step", "end_step", "batch_commitment", "update_norm"}
_OPTIONAL_IV = {"ext"}
MAX_EXT_BYTES = 65536

#: A validator of one extension value: raises ``ValueError`` with a short message when the
#: value is not what the extension's SPEC section allows. ``where`` names it in the message.
ExtensionCheck = Callable[[Any, str], None]

#: Keys a manifest's top-level ``ext`` object may hold (SPEC §11.5), each with its validator.
#: A feature that commits run-wide claims adds its key here and its section to SPEC.
RUN_EXTENSIONS: dict[str, ExtensionCheck] = {}

#: Keys an interval's ``ext`` object may hold (SPEC §11.5), each with its validator.
INTERVAL_EXTENSIONS: dict[str, ExtensionCheck] = {}
INTERVAL_EXTENSIONS[LOSS_KEY] = check_loss_value  # SPEC §11.7: the interval's training loss

# SPEC §11.6: data-parallel runs (the ranks, and each rank's digest of each interval).
RUN_EXTENSIONS["ranks"] = check_ranks
INTERVAL_EXTENSIONS["rank_digests"] = check_rank_digests


def _bad(msg: str) -> FormatError:
    return FormatError(f"manifest: {msg}", reason="MANIFEST_MALFORMED")


@dataclass(frozen=True)
class ManifestCheckpoint:
    """One ``checkpoints`` entry of a manifest (SPEC §11.2), typed."""

    index: int
    step: int
    root: bytes
    blob: str
    nbytes: int


@dataclass(frozen=True)
class ManifestInterval:
    """One ``intervals`` entry of a manifest (SPEC §11.2), typed."""

    index: int
    start_step: int
    end_step: int
    batch_commitment: bytes
    update_norm: float
    ext: dict[str, Any] | None = None


@dataclass(frozen=True)
class Manifest:
    """A parsed, structurally valid manifest (values still unverified).

    ``raw`` is the JSON object (what the bytes and the transcript root are computed from);
    ``checkpoint_entries`` and ``interval_entries`` are its typed views. ``ext_digests``: the
    digests (SPEC §11.5) of the ``ext`` objects :func:`parse_manifest` checked, by interval
    index (``-1``: the run's), for :func:`transcript_root` (each is hashed once).
    """

    raw: dict[str, Any]
    ext_digests: Mapping[int, bytes] = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def checkpoint_entries(self) -> tuple[ManifestCheckpoint, ...]:
        """The checkpoints, typed (roots as bytes)."""
        return tuple(
            ManifestCheckpoint(
                c["index"], c["step"], bytes.fromhex(c["root"]), c["blob"], c["nbytes"]
            )
            for c in self.raw["checkpoints"]
        )

    @cached_property
    def interval_entries(self) -> tuple[ManifestInterval, ...]:
        """The intervals, typed (commitments as bytes, norms as binary64)."""
        return tuple(
            ManifestInterval(
                i["index"],
                i["start_step"],
                i["end_step"],
                bytes.fromhex(i["batch_commitment"]),
                float(i["update_norm"]),
                i.get("ext"),
            )
            for i in self.raw["intervals"]
        )

    @property
    def job_id(self) -> bytes:
        return bytes.fromhex(self.raw["job_id"])

    @property
    def worker_key(self) -> bytes:
        return bytes.fromhex(self.raw["worker_key"])

    @property
    def transcript_root(self) -> bytes:
        return bytes.fromhex(self.raw["transcript_root"])

    @property
    def data_root(self) -> bytes:
        return bytes.fromhex(self.raw["data_root"])

    @property
    def ext(self) -> dict[str, Any] | None:
        """The run's ``ext`` object (SPEC §11.5), or ``None``."""
        return cast("dict[str, Any] | None", self.raw.get("ext"))

    @property
    def checkpoints(self) -> list[dict[str, Any]]:
        return cast("list[dict[str, Any]]", self.raw["checkpoints"])

    @property
    def intervals(self) -> list[dict[str, Any]]:
        return cast("list[dict[str, Any]]", self.raw["intervals"])

    def to_bytes(self) -> bytes:
        """Canonical JSON bytes (what ``manifest.json`` holds)."""
        return canonical_json(self.raw)


def ext_digest(ext: Mapping[str, Any] | None) -> bytes:
    """The 32-byte digest of an ``ext`` object (SPEC §11.5); zero bytes for none."""
    if ext is None:
        return ZERO32
    return tagged_hash(TAG_TRANSCRIPT_EXT, canonical_json(dict(ext)))


def header_leaf(
    job_id: bytes,
    worker_key: bytes,
    data_root: bytes,
    interval: int,
    steps: int,
    n_checkpoints: int,
    ext: Mapping[str, Any] | None = None,
    *,
    digest: bytes | None = None,
) -> bytes:
    """The transcript's header leaf (SPEC §11.1); ``ext`` is the run's ``ext`` object
    (``digest``: its :func:`ext_digest`, where already known)."""
    return tagged_hash(
        TAG_TRANSCRIPT_HEADER,
        job_id,
        worker_key,
        data_root,
        u64(interval),
        u64(steps),
        u64(n_checkpoints),
        ext_digest(ext) if digest is None else digest,
    )


def checkpoint_leaf(
    index: int,
    step: int,
    root: bytes,
    batch_commitment: bytes,
    norm: float,
    ext: Mapping[str, Any] | None = None,
    *,
    digest: bytes | None = None,
) -> bytes:
    """The transcript leaf of checkpoint ``index`` (SPEC §11.1).

    ``ext`` is the ``ext`` object of the interval ending at this checkpoint (none for 0);
    ``digest``: its :func:`ext_digest`, where already known.
    """
    return tagged_hash(
        TAG_TRANSCRIPT_LEAF,
        u64(index),
        u64(step),
        root,
        batch_commitment,
        f64(norm),
        ext_digest(ext) if digest is None else digest,
    )


def transcript_leaves(
    m: dict[str, Any], ext_digests: Mapping[int, bytes] | None = None
) -> list[bytes]:
    """All leaves (header first) of a manifest dict. ``ext_digests``: the ``ext`` objects'
    digests by interval index (``-1``: the run's) where already known (``Manifest``)."""
    known = ext_digests or {}
    leaves = [
        header_leaf(
            bytes.fromhex(m["job_id"]),
            bytes.fromhex(m["worker_key"]),
            bytes.fromhex(m["data_root"]),
            m["interval"],
            m["steps"],
            len(m["checkpoints"]),
            m.get("ext"),
            digest=known.get(-1),
        )
    ]
    for ck in m["checkpoints"]:
        j = ck["index"]
        iv = m["intervals"][j - 1] if j > 0 else None
        leaves.append(
            checkpoint_leaf(
                j,
                ck["step"],
                bytes.fromhex(ck["root"]),
                bytes.fromhex(iv["batch_commitment"]) if iv else ZERO32,
                float(iv["update_norm"]) if iv else 0.0,
                iv.get("ext") if iv else None,
                digest=known.get(j - 1) if iv else None,
            )
        )
    return leaves


def transcript_root(m: dict[str, Any], ext_digests: Mapping[int, bytes] | None = None) -> bytes:
    """The transcript root of a manifest dict (SPEC §11.1); ``ext_digests`` as for
    :func:`transcript_leaves`."""
    return merkle_root([leaf_hash(x) for x in transcript_leaves(m, ext_digests)])


def signing_digest(job_id: bytes, root: bytes, worker_key: bytes) -> bytes:
    """What the worker signs (SPEC §11.4)."""
    return tagged_hash(TAG_SIGNATURE, job_id, root, worker_key)


def _int(v: Any, what: str, lo: int = 0, hi: int = 1 << 62) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _bad(f"{what} must be an integer in [{lo}, {hi}]")
    return v


def _hex(v: Any, what: str) -> None:
    try:
        parse_hex_digest(v, what=what)
    except FormatError as e:
        raise _bad(str(e)) from None


def _check_ext(ext: Any, allowed: Mapping[str, ExtensionCheck], where: str) -> bytes:
    """SPEC §11.5: a non-empty object of known keys, each value valid, bounded in size; its
    digest (:func:`ext_digest`). ``ext`` comes from :func:`parse_json` (values checked)."""
    if not isinstance(ext, dict) or not ext:
        raise _bad(f"{where} ext must be a non-empty object")
    unknown = sorted(set(ext) - set(allowed))
    if unknown:
        raise _bad(f"{where} ext has unknown key(s) {unknown}")
    encoded = encode_parsed(ext)  # = canonical_json(ext): the parse checked the values
    if len(encoded) > MAX_EXT_BYTES:
        raise _bad(f"{where} ext is over {MAX_EXT_BYTES} bytes")
    for key in sorted(ext):
        try:
            allowed[key](ext[key], f"{where} ext.{key}")
        except ValueError as e:
            raise _bad(str(e)) from None
    return tagged_hash(TAG_TRANSCRIPT_EXT, encoded)


def parse_manifest(data: bytes) -> Manifest:
    """Parse and structurally check ``manifest.json`` bytes (SPEC §11.2).

    Raises:
        FormatError: with ``reason`` MANIFEST_TOO_LARGE, MANIFEST_MALFORMED or
            UNSUPPORTED_VERSION.
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise FormatError(
            f"manifest is over {MAX_MANIFEST_BYTES} bytes", reason="MANIFEST_TOO_LARGE"
        )
    try:
        m = parse_json(data, limit=MAX_MANIFEST_BYTES, what="manifest")
    except FormatError as e:
        raise _bad(str(e)) from None
    if not isinstance(m, dict):
        raise _bad("top level must be an object")
    if m.get("format") != BUNDLE_FORMAT:
        raise _bad(f"format must be {BUNDLE_FORMAT!r}")
    if m.get("version") != BUNDLE_VERSION:
        raise FormatError(
            f"unsupported bundle version {m.get('version')!r}", reason="UNSUPPORTED_VERSION"
        )
    keys = set(m)
    if not _TOP_KEYS <= keys or keys - _TOP_KEYS - _OPTIONAL_TOP:
        raise _bad(f"keys must be {sorted(_TOP_KEYS)} (+ optional {sorted(_OPTIONAL_TOP)})")
    for k in ("job_id", "worker_key", "data_root", "transcript_root"):
        _hex(m[k], k)
    k_ = _int(m["interval"], "interval", 1)
    steps = _int(m["steps"], "steps", 1)
    if m["chunk_size"] != 65536:
        raise _bad("chunk_size must be 65536")
    cks, ivs = m["checkpoints"], m["intervals"]
    digests: dict[int, bytes] = {}  # SPEC §11.5: each ext object's digest, hashed once
    if not isinstance(cks, list) or not isinstance(ivs, list):
        raise _bad("checkpoints and intervals must be lists")
    if not 2 <= len(cks) <= MAX_CHECKPOINTS or len(ivs) != len(cks) - 1:
        raise _bad("need m + 1 checkpoints and m intervals, m >= 1")
    for j, ck in enumerate(cks):
        if not isinstance(ck, dict) or set(ck) != _CK_KEYS:
            raise _bad(f"checkpoint {j} must have keys {sorted(_CK_KEYS)}")
        if _int(ck["index"], "checkpoint index") != j:
            raise _bad(f"checkpoint {j} has index {ck['index']}")
        _int(ck["step"], "checkpoint step")
        _int(ck["nbytes"], "checkpoint nbytes")
        _hex(ck["root"], f"checkpoint {j} root")
        if not isinstance(ck["blob"], str) or len(ck["blob"]) > 256:
            raise _bad(f"checkpoint {j} blob must be a short string")
    for i, iv in enumerate(ivs):
        if not isinstance(iv, dict) or not _IV_KEYS <= set(iv) or set(iv) - _IV_KEYS - _OPTIONAL_IV:
            opt = sorted(_OPTIONAL_IV)
            raise _bad(f"interval {i} must have keys {sorted(_IV_KEYS)} (+ optional {opt})")
        if "ext" in iv:
            digests[i] = _check_ext(iv["ext"], INTERVAL_EXTENSIONS, f"interval {i}")
        if _int(iv["index"], "interval index") != i:
            raise _bad(f"interval {i} has index {iv['index']}")
        _int(iv["start_step"], "start_step")
        _int(iv["end_step"], "end_step")
        _hex(iv["batch_commitment"], f"interval {i} batch_commitment")
        n = iv["update_norm"]
        if isinstance(n, bool) or not isinstance(n, int | float) or n < 0:
            raise _bad(f"interval {i} update_norm must be a non-negative number")
        if isinstance(n, int) and float(n) != n:  # SPEC §1.3: an integer token in a binary64
            raise _bad(f"interval {i} update_norm {n} is not a binary64 value")
    if "proofs" in m and not isinstance(m["proofs"], list):
        raise _bad("proofs must be a list")
    if "ext" in m:
        digests[-1] = _check_ext(m["ext"], RUN_EXTENSIONS, "run")
    if "rank_signatures" in m and (msg := check_rank_signatures(m["rank_signatures"])):
        raise _bad(msg)
    del k_, steps
    return Manifest(m, digests)


# SPEC VI §4: the rounding backend's extensions (its validators need no torch).
from dk.pol.backends import ext as _rounding_ext  # noqa: E402  (after the registries exist)

RUN_EXTENSIONS[_rounding_ext.RUN_KEY] = _rounding_ext.check_run_ext
INTERVAL_EXTENSIONS[_rounding_ext.INTERVAL_KEY] = _rounding_ext.check_log_ext
