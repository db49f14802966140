"""The checked-in market vectors re-check, and a corrupted vector is reported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dk.vectors.market import check

VECTORS = Path(__file__).resolve().parents[3] / "vectors"


def test_market_vectors_check() -> None:
    results = check(VECTORS)
    assert len(results) >= 25
    assert all(r.ok for r in results), [r for r in results if not r.ok]


def test_corrupted_vector_is_reported(tmp_path: Path) -> None:
    shutil.copytree(VECTORS / "market", tmp_path / "market")
    path = tmp_path / "market" / "events.json"
    doc = json.loads(path.read_text())
    doc["cases"][0]["events"][1]["body"]["at"] += 1
    path.write_text(json.dumps(doc))
    bad = [r for r in check(tmp_path) if not r.ok]
    assert [(r.file, r.tc_id) for r in bad] == [("events.json", 1)]
