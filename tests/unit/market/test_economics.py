"""The economic default policy (SPEC V §10): skipping any fraction of the work loses money."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dk.market.economics import economic_samples, explain, miss_probability, skipping_loses


def exact_loses(m: int, s: int, price: int, stake: int, gamma: int) -> bool:
    """The same rule in exact rational arithmetic, from the binomial coefficients."""
    for d in range(1, m + 1):
        p = 1 - Fraction(math.comb(m - d, s), math.comb(m, s))
        need = min(
            Fraction(gamma) * Fraction(d, m) * price, (1 - Fraction(1, gamma)) * (stake + price)
        )
        if p * (stake + price) < need:
            return False
    return True


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    m=st.integers(1, 60),
    price=st.integers(1, 10_000),
    stake=st.integers(0, 10_000),
    gamma=st.integers(1, 20),
)
def test_smallest_s_agrees_with_exact_arithmetic(
    m: int, price: int, stake: int, gamma: int
) -> None:
    s = economic_samples(m, price, stake, gamma)
    assert 1 <= s <= m
    if s < m:
        assert exact_loses(m, s, price, stake, gamma)
    if s > 1:
        assert not exact_loses(m, s - 1, price, stake, gamma)


def test_known_values() -> None:
    # stake = price, gamma = 10: small skips need 2s ≥ 10, skips of ≥ 20 % need p ≥ 0.9
    s = economic_samples(1000, 100, 100, 10)
    assert 11 <= s <= 12
    assert skipping_loses(1000, s, 100, 100, 10) and not skipping_loses(1000, s - 1, 100, 100, 10)
    # a larger stake buys fewer samples
    assert economic_samples(1000, 100, 10_000, 10) < s
    # gamma = 1 with any stake: one sample already makes cheating a losing bet
    assert economic_samples(1000, 100, 1, 1) == 1
    # the old market default (2 samples) is not enough at these economics
    assert not skipping_loses(1000, 2, 100, 100, 10)


def test_miss_probability_edges() -> None:
    assert miss_probability(10, 0, 3) == 1.0
    assert miss_probability(10, 8, 3) == 0.0
    assert miss_probability(10, 1, 1) == pytest.approx(0.9)


def test_explain_rows() -> None:
    e = explain(1000, 100, 100)
    assert e.samples == economic_samples(1000, 100, 100)
    assert [r["skipped"] for r in e.rows] == [10, 50, 100, 250, 500, 1000]
    for r in e.rows:
        assert r["expected_loss"] >= min(10 * r["expected_gain"], 0.9 * 200) * (1 - 1e-12)
    assert e.to_dict()["samples"] == e.samples


def test_bad_inputs() -> None:
    for args in ((0, 1, 1), (10, 0, 1), (10, 1, -1)):
        with pytest.raises(ValueError):
            economic_samples(*args)
    with pytest.raises(ValueError):
        economic_samples(10, 1, 1, gamma=0.5)


def _least_s_reference(m: int, price: int, stake: int, gamma: float) -> int:
    """SPEC V §10's least ``s`` by the scalar rule, scanning ``s`` upward (small ``m`` only)."""
    return next((s for s in range(1, m + 1) if skipping_loses(m, s, price, stake, gamma)), m)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    m=st.integers(1, 120),
    s=st.integers(1, 130),
    price=st.integers(1, 10**6),
    stake=st.integers(0, 10**6),
    gamma=st.sampled_from([1, 1.5, 2, 10, 10.0, 37.5, 1000]),
)
def test_every_d_at_once_is_the_scalar_rule(
    m: int, s: int, price: int, stake: int, gamma: float
) -> None:
    """The vectorised check gives the scalar rule's answer for every (m, s) (the same binary64
    operations per ``d``), and the least ``s`` found by doubling is the least by a scan."""
    from dk.market.economics import _skipping_loses_fast

    assert _skipping_loses_fast(m, s, price, stake, gamma) == skipping_loses(
        m, s, price, stake, gamma
    )
    assert economic_samples(m, price, stake, gamma) == _least_s_reference(m, price, stake, gamma)


def test_the_per_d_values_are_bit_identical() -> None:
    """Where the rule is tight, ``p(d)`` of the vector pass equals ``miss_probability``'s bit
    for bit (a comparison of booleans alone could hide a last-bit difference)."""
    import numpy as np

    m, s = 997, 23
    d = np.arange(1, m + 1, dtype=np.float64)
    miss = np.ones(m)
    for i in range(min(s, m - 1)):
        miss *= (m - d - i) / float(m - i)
    miss[s > m - d] = 0.0
    want = np.array([miss_probability(m, int(k), s) for k in range(1, m + 1)])
    assert np.array_equal(miss.view(np.int64), want.view(np.int64))


def test_a_hundred_thousand_intervals_are_quick() -> None:
    """m = 100 000 (SPEC I §11.2's largest run): the doubling search checks small ``s`` only
    (the binary search from m took minutes here, inside the market's verification)."""
    s = economic_samples(100_000, 100, 60)
    assert skipping_loses(100_000, s, 100, 60, 10) and not skipping_loses(
        100_000, s - 1, 100, 60, 10
    )
