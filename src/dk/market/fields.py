"""Validation of request parameters: bounded integers, hex digests, tags, policies (spec §4)."""

from __future__ import annotations

import re
from typing import Any

from dk.errors import FormatError
from dk.market.ledger import MAX_AMOUNT

MAX_TAGS = 16
_TAG_RE = re.compile(r"^[a-z0-9][a-z0-9_.:-]{0,63}$")
_ID_RE = re.compile(r"^[obcpw][1-9][0-9]{0,17}$")


def _bad(msg: str) -> FormatError:
    return FormatError(f"market request: {msg}", reason="BAD_PARAMS")


def only(
    params: dict[str, Any], required: set[str], optional: frozenset[str] | set[str] = frozenset()
) -> None:
    """Refuse missing or unknown parameter names.

    Raises:
        FormatError: ``BAD_PARAMS``.
    """
    missing = required - set(params)
    extra = set(params) - required - set(optional)
    if missing or extra:
        raise _bad(f"missing {sorted(missing)} / unknown {sorted(extra)} parameters")


def integer(params: dict[str, Any], name: str, lo: int = 0, hi: int = MAX_AMOUNT - 1) -> int:
    """An integer parameter in ``[lo, hi]`` (booleans refused).

    Raises:
        FormatError: ``BAD_PARAMS``.
    """
    v = params.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise _bad(f"{name} must be an integer in [{lo}, {hi}]")
    return v


def amount(params: dict[str, Any], name: str = "amount") -> int:
    """A strictly positive amount of money in the smallest unit."""
    return integer(params, name, 1, MAX_AMOUNT - 1)


def number(params: dict[str, Any], name: str, lo: float, hi: float) -> float:
    """A finite binary64 parameter in ``[lo, hi]`` (an integer token is read as its float;
    booleans refused). Canonical JSON writes it as ECMAScript does (SPEC §1.3).

    Raises:
        FormatError: ``BAD_PARAMS``.
    """
    v = params.get(name)
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise _bad(f"{name} must be a number in [{lo:g}, {hi:g}]")
    x = float(v)
    if not lo <= x <= hi:  # NaN fails too
        raise _bad(f"{name} must be a number in [{lo:g}, {hi:g}]")
    return x


def digest_hex(params: dict[str, Any], name: str) -> str:
    """A 32-byte digest written as 64 lowercase hex characters.

    Raises:
        FormatError: ``BAD_PARAMS``.
    """
    v = params.get(name)
    if not isinstance(v, str) or not re.fullmatch(r"[0-9a-f]{64}", v):
        raise _bad(f"{name} must be 64 lowercase hex characters")
    return v


def object_id(params: dict[str, Any], name: str, prefix: str) -> str:
    """An order (``o``), bid (``b``), challenge (``c``), profile (``p``) or whistle (``w``) id
    such as ``o12``.

    Raises:
        FormatError: ``BAD_PARAMS``.
    """
    v = params.get(name)
    if not isinstance(v, str) or not _ID_RE.match(v) or v[0] != prefix:
        raise _bad(f"{name} must look like {prefix}123")
    return v


def tags(params: dict[str, Any], name: str = "tags") -> dict[str, str]:
    """Free-form string tags (region, hardware, …): at most 16, keys and values ``[a-z0-9_.:-]``.

    Raises:
        FormatError: ``BAD_PARAMS``.
    """
    v = params.get(name, {})
    if not isinstance(v, dict) or len(v) > MAX_TAGS:
        raise _bad(f"{name} must be an object with at most {MAX_TAGS} entries")
    for k, x in v.items():
        if not _TAG_RE.match(k) or not isinstance(x, str) or not _TAG_RE.match(x):
            raise _bad(f"tag {k!r} must map a short [a-z0-9_.:-] name to such a value")
    return dict(v)


def policy(params: dict[str, Any], defaults: dict[str, int]) -> dict[str, int | None]:
    """The verification policy: ``samples``, ``topq``, ``k`` (attestations), ``n`` (validators
    drawn, ``k <= n``), ``window`` (s), ``profiles`` (tolerance profiles needed, 0 = the job's
    own tolerance; SPEC V §12).

    Missing entries take the market's defaults (a missing ``n`` is raised to ``k``); unknown
    entries are refused. A missing ``samples`` is ``None``: the economic default, fixed when
    the market first verifies the result (SPEC V §10).

    Raises:
        FormatError: ``BAD_PARAMS``.
    """
    v = params.get("policy", {})
    if not isinstance(v, dict) or set(v) - set(defaults):
        raise _bad(f"policy may only set {sorted(defaults)}")
    out = {**defaults, **v}
    bounds = {
        "samples": (0, 4096),
        "topq": (0, 4096),
        "k": (1, 64),
        "n": (1, 64),
        "window": (0, 10**9),
        "profiles": (0, 64),
    }
    for key, (lo, hi) in bounds.items():
        integer(out, key, lo, hi)
    if "n" not in v:
        out["n"] = max(out["n"], out["k"])
    if out["k"] > out["n"]:
        raise _bad("policy k (attestations) must not exceed n (validators drawn)")
    if "samples" in v and out["samples"] + out["topq"] == 0:
        raise _bad("policy must challenge at least one interval (samples + topq >= 1)")
    if "samples" not in v:
        out["samples"] = None  # the economic default (SPEC V §10), at least 1
    return out
