"""Bounded reads of a bundle's small files (SPEC §11.2-§11.3): never follow links, never read
past a limit."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dk.errors import FormatError
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
