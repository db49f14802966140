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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AREAS = (
    "crypto",
    "pol",
    "bundle",
    "modes",
    "exact",
    "compress",
    "market",
    "circuits",
    "rounding",
    "fl",
    "dp",
)

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


def run_cases(
    root: str | Path,
    area: str,
    checks: Mapping[str, Callable[[dict[str, Any]], str]],
    *,
    checked_elsewhere: tuple[str, ...] = (),
) -> list[CaseResult]:
    """Run ``checks[file](case)`` over every case of each file under ``root/area/``.

    A check returns ``""`` when the case holds, else a one-line reason; an exception in a
    check fails that case only. A missing file, and a ``.json`` file no check knows, are one
    failed case each.
    """
    results: list[CaseResult] = []
    folder = Path(root) / area
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if path.name not in checks and path.name not in checked_elsewhere:
            results.append(CaseResult(area, path.name, 0, False, "no checker for this file"))
    for name, fn in checks.items():
        path = Path(root) / area / name
        if not path.exists():
            results.append(CaseResult(area, name, 0, False, "file missing"))
            continue
        try:
            cases = load_cases(path)["cases"]
            if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
                raise ValueError("'cases' is not a list of objects")
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as e:  # one failed case
            results.append(CaseResult(area, name, 0, False, f"not a vector file: {e}"))
            continue
        for case in cases:
            try:
                message = fn(case)
            except Exception as e:  # a crash on one case is a failed case, not an abort
                message = f"{type(e).__name__}: {e}"
            results.append(CaseResult(area, name, case.get("tcId", 0), not message, message))
    return results


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
        try:
            results.extend(module.check(root))
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as e:  # a damaged file
            results.append(CaseResult(area, "*", 0, False, f"not a vector file: {e}"))
    return results
