"""The rounding backend's manifest extensions (SPEC VI §4, Part I §11.5); no torch here.

A run on ``pol.backend = "rounded"`` commits, in its signed manifest:

* the run's ``ext.rounding`` = ``{"torch": "<release>"}``: the PyTorch release that decomposed
  the training step into rounding sites (a verifier on another release cannot judge);
* every interval's ``ext.rounding_log`` = ``{"blob": "logs/<digest>.dkrl", "digest": <hex>,
  "nbytes": <n>}``: the interval's log blob, its ``tagged_hash("dk/v1/rounding/log", blob)``
  and its exact size. The digest enters the interval's transcript leaf through ``ext``.
"""

from __future__ import annotations

import re
from typing import Any

from dk.pol.backends.log import MAX_LOG_BYTES, log_digest

RUN_KEY = "rounding"
INTERVAL_KEY = "rounding_log"
LOG_SUFFIX = ".dkrl"
_HEX64 = re.compile(r"[0-9a-f]{64}")
# SPEC VI §4: a public release: 2.13.0, a pre-release (2.13.0rc1), a post or development
# release (torch's nightlies: 2.6.0.dev20241112), never a +local part
_RELEASE = re.compile(r"[0-9]+(\.[0-9]+){1,3}([a-z]+[0-9]*)?(\.post[0-9]+)?(\.dev[0-9]+)?")


def log_blob_name(digest: bytes) -> str:
    """Where interval log ``digest`` lives in a run or bundle directory (SPEC VI §4)."""
    return f"logs/{digest.hex()}{LOG_SUFFIX}"


def log_ext(blob: bytes) -> dict[str, Any]:
    """The ``ext.rounding_log`` value committing one interval's log blob (SPEC VI §4)."""
    digest = log_digest(blob)
    return {"blob": log_blob_name(digest), "digest": digest.hex(), "nbytes": len(blob)}


def torch_release(version: str) -> str:
    """The public release of a torch version string (``2.13.0+cpu`` -> ``2.13.0``)."""
    return version.split("+", 1)[0]


def check_log_ext(value: Any, where: str) -> None:
    """SPEC VI §4: exactly ``blob`` (a short string), ``digest`` (hex), ``nbytes`` (bounded).

    The blob path rule (``logs/<digest>.dkrl``) is the verifier's ``BAD_PATH`` check, not a
    parse error, as for checkpoint blobs (Part I §11.2).

    Raises:
        ValueError: the value is not of that shape.
    """
    if not isinstance(value, dict) or set(value) != {"blob", "digest", "nbytes"}:
        raise ValueError(f"{where} must be an object with keys blob, digest, nbytes")
    if not isinstance(value["blob"], str) or len(value["blob"]) > 256:
        raise ValueError(f"{where}.blob must be a short string")
    if not isinstance(value["digest"], str) or not _HEX64.fullmatch(value["digest"]):
        raise ValueError(f"{where}.digest must be 64 lowercase hex characters")
    n = value["nbytes"]
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_LOG_BYTES:
        raise ValueError(f"{where}.nbytes must be an integer in [1, {MAX_LOG_BYTES}]")


def check_run_ext(value: Any, where: str) -> None:
    """SPEC VI §4: exactly ``torch``, a public release string such as ``2.13.0``.

    Raises:
        ValueError: the value is not of that shape.
    """
    if not isinstance(value, dict) or set(value) != {"torch"}:
        raise ValueError(f"{where} must be an object with the key torch")
    v = value["torch"]
    if not isinstance(v, str) or len(v) > 32 or not _RELEASE.fullmatch(v):
        raise ValueError(f"{where}.torch must be a release such as '2.13.0'")
