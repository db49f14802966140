"""Checking the checked-in test vectors (``dk vectors check``).

Each area has a module ``dk.vectors.<area>`` with ``check(root: Path) -> list[CaseResult]``
that re-derives every case under ``root/<area>/`` with the library and compares. The matching
generator lives in the repository at ``vectors/gen/<area>.py`` (not in the wheel).

Vector files follow the Wycheproof shape::

    {"feature": "merkle", "version": 1, "cases": [
        {"tcId": 1, "comment": "...", "result": "valid" | "invalid",
         "expected_reason": "MERKLE_MISMATCH", ...}]}
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AREAS = ("crypto", "pol", "bundle", "exact", "compress", "market", "circuits")

MAX_VECTOR_FILE = 64 * 1024 * 1024


@dataclass(frozen=True)
class CaseResult:
    """Outcome of re-checking one vector case."""

    area: str
    file: str
    tc_id: int
    ok: bool
    message: str = ""


def load_cases(path: Path) -> dict[str, Any]:
    """Read one vector file (trusted repository content, still size-bounded)."""
    if path.stat().st_size > MAX_VECTOR_FILE:
        raise ValueError(f"{path} is larger than {MAX_VECTOR_FILE} bytes")
    return json.loads(path.read_text(encoding="utf-8"))


def write_cases(path: Path, feature: str, cases: list[dict[str, Any]], **extra: Any) -> None:
    """Write one vector file with stable formatting (used by the generators)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"feature": feature, "version": 1, **extra, "cases": cases}
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def check_all(root: str | Path) -> list[CaseResult]:
    """Check every area present under ``root``; areas whose folder is absent are skipped."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"vector directory not found: {root}")
    results: list[CaseResult] = []
    for area in AREAS:
        if not (root / area).is_dir():
            continue
        module = importlib.import_module(f"dk.vectors.{area}")
        results.extend(module.check(root))
    return results
