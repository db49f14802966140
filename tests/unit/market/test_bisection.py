"""Bisection between two transcripts' checkpoint roots."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dk.market.challenges import first_disagreement


def test_no_dispute_cases() -> None:
    assert first_disagreement(["a", "b", "c"], ["a", "b", "c"]) is None
    assert first_disagreement(["a", "b"], ["x", "b"]) is None  # initial checkpoints differ
    assert first_disagreement(["a"], ["a"]) is None


@given(st.lists(st.booleans(), min_size=1, max_size=64))
def test_bisection_finds_an_agree_then_differ_interval(flags: list[bool]) -> None:
    ours = [f"r{i}" for i in range(len(flags) + 1)]
    theirs = ["r0"] + [f"r{i + 1}" if same else f"x{i + 1}" for i, same in enumerate(flags)]
    found = first_disagreement(ours, theirs)
    if ours[-1] == theirs[-1]:
        assert found is None
    else:
        assert found is not None
        assert ours[found] == theirs[found] and ours[found + 1] != theirs[found + 1]
