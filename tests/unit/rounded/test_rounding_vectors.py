"""``vectors/rounding/``: every case passes, both kinds exist, regeneration is byte-identical."""

from __future__ import annotations

import json
from pathlib import Path

from dk.vectors.rounding import check

ROOT = Path(__file__).resolve().parents[3] / "vectors"


def test_every_case_passes() -> None:
    results = check(ROOT)
    assert len(results) > 30
    assert [(r.file, r.tc_id, r.message) for r in results if not r.ok] == []


def test_valid_and_invalid_cases_with_reasons() -> None:
    for name in ("log.json", "replay.json"):
        cases = json.loads((ROOT / "rounding" / name).read_text())["cases"]
        assert {c["result"] for c in cases} == {"valid", "invalid"}
        assert all(c["result"] == "valid" or c["expected_reason"] for c in cases)
        assert [c["tcId"] for c in cases] == list(range(1, len(cases) + 1))


def test_regeneration_is_byte_identical(tmp_path: Path) -> None:
    from vectors.gen import rounding

    rounding.generate(tmp_path)
    for name in ("log.json", "replay.json"):
        assert (tmp_path / "rounding" / name).read_bytes() == (
            ROOT / "rounding" / name
        ).read_bytes()
