"""The verifier's checks run in the order SPEC §12.2 makes normative (the first reason code,
which the report digest covers, depends on it)."""

from __future__ import annotations

import re
from pathlib import Path

from dk.verifier.verify import CHECKS

SPEC = Path(__file__).resolve().parents[3] / "SPEC.md"


def test_checks_follow_spec_12_2() -> None:
    text = SPEC.read_text(encoding="utf-8")
    section = text[text.index("### §12.2") : text.index("### §12.3")]
    steps = re.findall(r"^\d+a?\. \*\*([a-z ]+)\*\*", section, flags=re.M)
    assert len(steps) == len(CHECKS) == 17, steps  # 5a: ranks (SPEC §11.6)
    names = [f.__name__ for f in CHECKS]
    want = [s if s == "challenge" else "check_" + s.replace(" ", "_") for s in steps]
    assert names == want
