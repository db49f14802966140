"""Top-k with error feedback still learns (the full accuracy table is in the benchmark)."""

from __future__ import annotations

from dk.compress.digits import train_digits


def test_topk_with_error_feedback_learns_digits():
    result = train_digits("topk:0.01", steps=300)
    assert result.accuracy > 0.85  # chance is 0.10; dense reaches ~0.97 here
    assert result.ratio > 40  # 1% of the elements at 8 bytes each, plus the header
