"""Bounded reads of a bundle's small files (SPEC §11.2-§11.3): never follow links, never read
past a limit; checkpoint blobs parsed in one order."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np

from dk.errors import FormatError
from dk.pol.checkpoint import parse_blob
from dk.verifier.report import Reason


def read_bounded(path: Path, limit: int, missing: Reason, too_large: Reason) -> bytes:
    """Read a regular file of at most ``limit`` bytes.

    Raises:
        FormatError: with reason ``missing``, ``BAD_PATH`` (a link or not a regular file) or
            ``too_large``.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise FormatError(f"{path.name} is missing", reason=missing.value) from None
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{path.name} is not a regular file", reason=Reason.BAD_PATH.value)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FormatError(f"{path.name} is over {limit} bytes", reason=too_large.value)
    return data


def parse_checkpoint(data: bytes) -> dict[str, np.ndarray]:
    """A checkpoint blob's tensors (``dk.pol.checkpoint.parse_blob``: strict, no pickle), in
    name order.

    safetensors returns a blob's tensors in no fixed order, and the hashing of a tensor set
    (SPEC §4.2) reuses its chunk plan only for a set it has seen in the same order, so every
    blob hashed in the order it was parsed in would be planned afresh (0.2 ms each).
    The order changes no hashed byte: the canonical stream sorts the names itself.
    """
    return dict(sorted(parse_blob(data).items()))
