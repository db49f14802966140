"""dk: verifiable ML training (Proof-of-Learning transcripts, proofs, verification, market).

Importing ``dk`` is cheap: sub-packages (and torch, numba, ezkl) load only when used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_SUBPACKAGES = ("crypto", "pol", "prover", "verifier", "circuits", "compress", "market", "cli")

__all__ = ["__version__", *_SUBPACKAGES]


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"dk.{name}")
    raise AttributeError(f"module 'dk' has no attribute {name!r}")
