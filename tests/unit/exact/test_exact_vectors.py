"""The checked-in exact replay vectors re-derive (valid roots match, invalid ones do not)."""

from __future__ import annotations

from pathlib import Path

from dk.vectors.exact import check

VECTORS = Path(__file__).resolve().parents[3] / "vectors"


def test_exact_vectors_check() -> None:
    results = check(VECTORS)
    per_file: dict[str, int] = {}
    for r in results:
        per_file[r.file] = per_file.get(r.file, 0) + 1
    assert per_file["replay.json"] == 8
    assert per_file.get("elementwise.json", 0) > 0  # SPEC II §4 exp32/log32/erf32
    assert [r.message for r in results if not r.ok] == []
