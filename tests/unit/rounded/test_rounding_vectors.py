"""``vectors/rounding/``: every case passes, both kinds exist, regeneration is byte-identical."""

from __future__ import annotations

import json
from pathlib import Path

from dk.vectors.rounding import check

ROOT = Path(__file__).resolve().parents[3] / "vectors"


def test_every_case_passes() -> None:
    results = check(ROOT)
    assert len(results) > 30
    assert sum(r.file == "bundle/cases.json" for r in results) >= 15  # SPEC VI §5 bundles
    assert [(r.file, r.tc_id, r.message) for r in results if not r.ok] == []


def test_valid_and_invalid_cases_with_reasons() -> None:
    for name in ("log.json", "replay.json"):
        cases = json.loads((ROOT / "rounding" / name).read_text())["cases"]
        assert {c["result"] for c in cases} == {"valid", "invalid"}
        assert all(c["result"] == "valid" or c["expected_reason"] for c in cases)
        assert [c["tcId"] for c in cases] == list(range(1, len(cases) + 1))


def test_regeneration_is_byte_identical(tmp_path: Path) -> None:
    from vectors.gen import rounding

    rounding.generate(tmp_path, bundles=False)  # the bundles: vectors/gen/rounding_bundle.py
    for name in ("log.json", "replay.json"):
        assert (tmp_path / "rounding" / name).read_bytes() == (
            ROOT / "rounding" / name
        ).read_bytes()
