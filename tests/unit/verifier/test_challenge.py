"""Challenge derivation and the detection figure (SPEC §12.1)."""

from __future__ import annotations

import hashlib
import math

import pytest

from dk.crypto.hashing import tagged_hash
from dk.crypto.stream import sample_without_replacement, stream_key
from dk.verifier.challenge import (
    challenge_seed,
    derive_challenge,
    detection_probability,
    samples_for,
)

ROOT = tagged_hash("dk/v1/job", b"a transcript")


def _direct(m: int, s: int, f: float) -> float:
    d = min(m, math.ceil(f * m - 1e-12))
    s = min(s, m)
    return 1.0 - math.comb(m - d, s) / math.comb(m, s)


@pytest.mark.parametrize("f", [0.0, 0.01, 0.1, 0.25, 1 / 3, 0.5, 0.99, 1.0])
def test_detection_probability_is_hypergeometric(f: float) -> None:
    for m in range(1, 41):
        for s in range(0, m + 3):
            assert detection_probability(m, s, f) == pytest.approx(_direct(m, s, f), abs=1e-12), (
                m,
                s,
                f,
            )


def test_detection_probability_edges() -> None:
    assert detection_probability(30, 3, 0.1) == pytest.approx(1 - (27 * 26 * 25) / (30 * 29 * 28))
    assert detection_probability(10, 0, 0.5) == 0.0
    assert detection_probability(10, 10, 0.1) == 1.0
    assert detection_probability(10, 5, 0.0) == 0.0
    assert detection_probability(10, 9, 0.1) == pytest.approx(
        0.9
    )  # misses only if it is the one left
    assert detection_probability(10, 9, 0.2) == 1.0  # 9 draws must hit one of two skipped
    assert detection_probability(10, 3, 0.1) == pytest.approx(0.3)  # ceil(0.1 * 10) = 1 skipped
    assert detection_probability(10, 1, 0.11) == pytest.approx(0.2)  # ceil(1.1) = 2 skipped


@pytest.mark.parametrize("m", [1, 5, 30, 100, 1000])
@pytest.mark.parametrize("f, target", [(0.1, 0.99), (0.05, 0.9), (0.5, 0.999), (0.01, 0.5)])
def test_samples_for_is_minimal(m: int, f: float, target: float) -> None:
    s = samples_for(m, f, target)
    assert 0 <= s <= m
    if detection_probability(m, m, f) >= target:
        assert detection_probability(m, s, f) >= target
        assert s == 0 or detection_probability(m, s - 1, f) < target
    else:
        assert s == m


def test_samples_for_known_values() -> None:
    direct = next(s for s in range(101) if 1 - math.comb(90, s) / math.comb(100, s) >= 0.99)
    assert samples_for(100, 0.1, 0.99) == direct == 36
    assert samples_for(10, 0.0, 0.99) == 10  # nothing to detect: all of them
    assert samples_for(10, 0.5, 0.0) == 0


def test_challenge_seed_layout() -> None:
    # SPEC §12.1 from the text, with hashlib alone.
    tag = b"dk/v1/challenge"
    want = hashlib.sha256(bytes([len(tag)]) + tag + ROOT + b"beacon").digest()
    assert challenge_seed(ROOT, b"beacon") == want


def test_derive_challenge_uniform_part() -> None:
    norms, epochs = [1.0] * 50, [0] * 50
    c = derive_challenge(ROOT, b"b1", norms, epochs, samples=7, topq=0)
    key = stream_key("challenge", 0, challenge_seed(ROOT, b"b1"))
    assert c == sorted(sample_without_replacement(key, 50, 7))
    assert c == derive_challenge(ROOT, b"b1", norms, epochs, samples=7, topq=0)
    assert len(c) == 7 == len(set(c)) and c == sorted(c)
    assert c != derive_challenge(ROOT, b"b2", norms, epochs, samples=7, topq=0)
    other_root = tagged_hash("dk/v1/job", b"another transcript")
    assert c != derive_challenge(other_root, b"b1", norms, epochs, samples=7, topq=0)
    assert derive_challenge(ROOT, b"b1", norms, epochs, samples=500, topq=0) == list(range(50))
    assert derive_challenge(ROOT, b"b1", norms, epochs, samples=0, topq=0) == []
    assert derive_challenge(ROOT, b"b1", [], [], samples=3, topq=1) == []


def test_derive_challenge_adds_top_q_per_epoch() -> None:
    norms = [0.1, 0.9, 0.3, 0.3, 2.0, 0.2, 0.5, 0.5, 0.4]
    epochs = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert derive_challenge(ROOT, b"x", norms, epochs, samples=0, topq=1) == [
        1,
        4,
        6,
    ]  # tie: lower index
    assert derive_challenge(ROOT, b"x", norms, epochs, samples=0, topq=2) == [1, 2, 3, 4, 6, 7]
    assert derive_challenge(ROOT, b"x", norms, epochs, samples=0, topq=5) == list(range(9))
    for beacon in (b"p", b"q", b"r"):
        uniform = derive_challenge(ROOT, beacon, norms, epochs, samples=2, topq=0)
        both = derive_challenge(ROOT, beacon, norms, epochs, samples=2, topq=1)
        assert both == sorted(set(uniform) | {1, 4, 6})
