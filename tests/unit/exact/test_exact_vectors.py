"""The checked-in exact replay vectors re-derive (valid roots match, invalid ones do not)."""

from __future__ import annotations

from pathlib import Path

from dk.vectors.exact import check

VECTORS = Path(__file__).resolve().parents[3] / "vectors"


def test_exact_vectors_check() -> None:
    results = check(VECTORS)
    assert len(results) == 8
    assert [r.message for r in results if not r.ok] == []
