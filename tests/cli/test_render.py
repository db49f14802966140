"""The plain-text verify summary (``dk.cli.render.report_summary``): what it counts."""

from __future__ import annotations

from typing import Any

from dk.cli.render import report_summary


def _report(verdict: str, **figures: Any) -> dict[str, Any]:
    base = {"intervals": 10, "detection_probability": 1.0, "skipped_fraction": 0.1}
    figs = {**base, **figures}
    return {"verdict": verdict, "findings": [], "challenged": [1, 2], "figures": figs}


def test_bytes_read_count_the_rounding_logs() -> None:
    d = _report("accept", bytes_read=100_000, rounding_log_bytes_read=300_000, verify_wall_s=1.0)
    assert any("0.4 MB read" in line for line in report_summary(d))


def test_an_inconclusive_report_says_its_detection_figure_is_the_challenges() -> None:
    acc, inc = (report_summary(_report(v, replayed_steps=0)) for v in ("accept", "inconclusive"))
    assert not any("had the replay been done" in line for line in acc)
    assert any("(0 steps replayed)" in ln and "had the replay been done" in ln for ln in inc)
