"""The checked-in exact vectors re-derive: replay roots (valid roots match, invalid ones do not)
and the elementwise functions of SPEC II §4, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

from dk.vectors.exact import check

VECTORS = Path(__file__).resolve().parents[3] / "vectors"


def test_exact_vectors_check() -> None:
    results = check(VECTORS)
    files = {"replay.json": 8, "elementwise.json": 15}
    for name, n in files.items():
        assert len(json.loads((VECTORS / "exact" / name).read_text())["cases"]) == n, name
    assert len(results) == sum(files.values())
    assert [r.message for r in results if not r.ok] == []
