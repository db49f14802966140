"""Parse codec spec strings such as ``"topk:0.01"`` (SPEC.md Part III §2).

Grammar (ASCII, at most 200 characters, no spaces)::

    spec  = name [ ":" item *( "," item ) ]
    item  = key "=" value | value          ; a bare value only first: the primary parameter

Primary parameters: ``topk`` ratio, ``int8``/``int4`` block, ``qsgd`` levels, ``powersgd``
rank. A key may appear once. Booleans are ``0``/``1``.
"""

from __future__ import annotations

import math
import re
from typing import Any

from dk.compress.codecs import (
    BlockQuantCodec,
    Codec,
    DenseCodec,
    PowerSGDCodec,
    QSGDCodec,
    TopKCodec,
)
from dk.errors import FormatError

MAX_SPEC = 200
REASON = "BAD_CODEC_SPEC"
_TOKEN = re.compile(r"[a-z0-9_.+-]+\Z")

# name -> (factory, primary key, {key: type})
_TABLE: dict[str, tuple[Any, str | None, dict[str, type]]] = {
    "none": (DenseCodec, None, {}),
    "topk": (
        TopKCodec,
        "ratio",
        {"ratio": float, "approx": bool, "ef": bool, "momentum": float, "samples": int},
    ),
    "int8": (lambda **kw: BlockQuantCodec(bits=8, **kw), "block", {"block": int, "ef": bool}),
    "int4": (lambda **kw: BlockQuantCodec(bits=4, **kw), "block", {"block": int, "ef": bool}),
    "qsgd": (QSGDCodec, "levels", {"levels": int, "block": int, "seed": int, "ef": bool}),
    "powersgd": (PowerSGDCodec, "rank", {"rank": int, "start_iter": int, "ef": bool}),
}


def _fail(message: str) -> FormatError:
    return FormatError(f"codec spec: {message}", reason=REASON)


def _value(key: str, raw: str, kind: type) -> Any:
    try:
        if kind is bool:
            if raw not in ("0", "1"):
                raise ValueError
            return raw == "1"
        if kind is int:
            if not re.fullmatch(r"[0-9]{1,20}", raw):
                raise ValueError
            return int(raw)
        v = float(raw)
        if not math.isfinite(v):
            raise ValueError
        return v
    except ValueError:
        raise _fail(f"bad value {raw!r} for {key} (expected {kind.__name__})") from None


def parse_codec(spec: str, *, backend: str = "numba") -> Codec:
    """Build the codec a spec string names.

    Args:
        spec: e.g. ``"topk:0.01"``, ``"int8:block=256"``, ``"qsgd:levels=16,seed=7"``.
        backend: kernel backend of the codec ("numba" or "numpy").

    Returns:
        The codec; ``codec.spec`` is the canonical form of ``spec``.

    Raises:
        FormatError: unknown codec or key, repeated key, bad value (reason BAD_CODEC_SPEC).
    """
    if not isinstance(spec, str) or not 0 < len(spec) <= MAX_SPEC or not spec.isascii():
        raise _fail(f"must be 1..{MAX_SPEC} ASCII characters")
    name, _, rest = spec.partition(":")
    if name not in _TABLE:
        raise _fail(f"unknown codec {name!r}; expected one of {sorted(_TABLE)}")
    factory, primary, kinds = _TABLE[name]
    kwargs: dict[str, Any] = {}
    items = rest.split(",") if rest else []
    if ":" in rest or (rest == "" and spec.endswith(":")):
        raise _fail(f"malformed spec {spec!r}")
    for pos, item in enumerate(items):
        key, eq, raw = item.partition("=")
        if not eq:
            if pos != 0 or primary is None:
                raise _fail(f"bare value {item!r} allowed only first, for {name}'s primary key")
            key, raw = primary, item
        if key not in kinds:
            raise _fail(f"unknown key {key!r} for {name}; expected one of {sorted(kinds)}")
        if key in kwargs:
            raise _fail(f"key {key!r} given twice")
        if not _TOKEN.match(raw):
            raise _fail(f"bad value {raw!r} for {key}")
        kwargs[key] = _value(key, raw, kinds[key])
    try:
        return factory(backend=backend, **kwargs)
    except ValueError as e:
        raise _fail(str(e)) from None
