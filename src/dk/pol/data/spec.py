"""The job's ``[data]`` table (SPEC §6.1): kinds, their fields, and the normal form."""

from __future__ import annotations

from typing import Any

from dk.errors import FormatError

KINDS = ("digits", "npz", "shards", "tokens", "images")
TOKEN_DTYPES = ("uint16", "uint32")
IMAGE_MODES = ("RGB", "L")
MAX_SEQ_LEN = 1 << 20
# kind -> its own keys and their defaults (None: required)
KIND_FIELDS: dict[str, dict[str, Any]] = {
    "digits": {},
    "npz": {},
    "shards": {},
    "tokens": {"dtype": "uint16", "seq_len": None},
    "images": {"decoder": None, "mode": "RGB"},
}
_COMMON = ("kind", "path", "root")
_HEX64 = frozenset("0123456789abcdef")


def _fail(msg: str) -> FormatError:
    return FormatError(f"job: {msg}", reason="JOB_MALFORMED")


def normalize_data(given: dict[str, Any]) -> dict[str, Any]:
    """Validate ``[data]`` and fill its defaults; the result keeps ``path`` (not hashed)."""
    if "dataset" in given:
        raise _fail("data.dataset is now data.kind (job format 2)")
    kind = given.get("kind", "digits")
    if kind not in KINDS:
        raise _fail(f"data.kind must be one of {', '.join(KINDS)}, got {kind!r}")
    own = KIND_FIELDS[kind]
    for k in given:
        if k in _COMMON or k in own:
            continue
        owner = [kd for kd, f in KIND_FIELDS.items() if k in f]
        if owner:
            raise _fail(f"data.{k} is only for kind = {owner[0]!r}")
        raise _fail(f"unknown key data.{k}")
    d: dict[str, Any] = {"kind": kind}
    if kind != "digits":
        path = given.get("path")
        if not isinstance(path, str) or not 0 < len(path) <= 4096:
            raise _fail(f"data.path is required for kind = {kind!r}")
    if "path" in given:
        if not isinstance(given["path"], str):
            raise _fail("data.path must be a string")
        d["path"] = given["path"]
    root = given.get("root", "")
    if root != "" and (not isinstance(root, str) or len(root) != 64 or not set(root) <= _HEX64):
        raise _fail("root must be 64 lowercase hex characters")
    d["root"] = root
    for k, default in own.items():
        v = given.get(k, default)
        if v is None:
            raise _fail(f"data.{k} is required for kind = {kind!r}")
        d[k] = v
    if kind == "tokens":
        if d["dtype"] not in TOKEN_DTYPES:
            raise _fail(f"data.dtype must be one of {', '.join(TOKEN_DTYPES)}, got {d['dtype']!r}")
        s = d["seq_len"]
        if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= MAX_SEQ_LEN:
            raise _fail(f"data.seq_len must be an integer in [1, {MAX_SEQ_LEN}], got {s!r}")
    if kind == "images":
        dec = d["decoder"]
        if not isinstance(dec, str) or not dec.startswith("pillow==") or len(dec) > 64:
            raise _fail(f"data.decoder must name the decoder as 'pillow==<version>', got {dec!r}")
        if d["mode"] not in IMAGE_MODES:
            raise _fail(f"data.mode must be one of {', '.join(IMAGE_MODES)}, got {d['mode']!r}")
    return d
