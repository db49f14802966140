"""The ChaCha20 stream (SPEC §5): keystream, bounded integers, permutations, samples."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from dk.crypto import stream
from dk.crypto.hashing import u64
from dk.crypto.stream import (
    PermutationIndex,
    WordReader,
    keystream,
    permutation,
    sample_without_replacement,
    stream_key,
    stream_words,
    uniform_floats,
)

KEY = stream_key("test", 7, b"label")


def _sha_tagged(tag: bytes, data: bytes) -> bytes:
    """SPEC §2 from the text, with hashlib alone (not dk's tagged_hash or its tag constants)."""
    return hashlib.sha256(bytes([len(tag)]) + tag + data).digest()


# RFC 8439 appendix A.1, test vectors #1 and #2: all-zero key and nonce, block counters 0 and 1.
RFC8439_BLOCK0 = bytes.fromhex(
    "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
    "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586"
)
RFC8439_BLOCK1 = bytes.fromhex(
    "9f07e7be5551387a98ba977c732d080dcb0f29a048e3656912c6533e32ee7aed"
    "29b721769ce64e43d57133b074d839d531ed1f28510afb45ace10a1f4b794d6f"
)


def test_keystream_is_rfc8439_chacha20() -> None:
    assert keystream(bytes(32), 64) == RFC8439_BLOCK0
    assert keystream(bytes(32), 64, offset_blocks=1) == RFC8439_BLOCK1
    assert keystream(bytes(32), 128) == RFC8439_BLOCK0 + RFC8439_BLOCK1


def test_stream_key_layout_and_separation() -> None:
    # SPEC §5.1: u8(len(purpose)) || purpose || u64(index) || label, under "dk/v1/stream".
    want = _sha_tagged(b"dk/v1/stream", b"\x04test" + (7).to_bytes(8, "little") + b"label")
    assert KEY == want
    keys = {
        stream_key("test", 7, b"label"),
        stream_key("test", 8, b"label"),
        stream_key("test", 7, b"other"),
        stream_key("tesu", 7, b"label"),
        stream_key("test", 7),
    }
    assert len(keys) == 5
    # the purpose length prefix keeps purpose and seed apart
    assert stream_key("ab", 0) != stream_key("a", 0, b"b")
    for bad in [("", 0), ("x" * 256, 0), ("test", -1), ("test", 2**64)]:
        with pytest.raises(ValueError):
            stream_key(*bad)


def test_word_reader_matches_stream_words_across_refills() -> None:
    n = 3 * WordReader._BLOCK_WORDS + 5
    r = WordReader(KEY)
    assert [r.next_word() for _ in range(n)] == stream_words(KEY, n).tolist()


class _Fed(WordReader):
    """A reader that returns chosen words (to hit the rejection branch)."""

    def __init__(self, words: list[int]) -> None:
        super().__init__(KEY)
        self.words = list(words)

    def next_word(self) -> int:
        return self.words.pop(0)


def test_uniform_int_rejects_the_biased_tail() -> None:
    top = 2**64 - 1
    # bound 3: 2**64 % 3 == 1, so only the top word is rejected.
    assert _Fed([top, 5]).uniform_int(3) == 2
    assert _Fed([top - 1]).uniform_int(3) == (top - 1) % 3
    # bound 2**63 + 1: limit is 2**63 + 1, every word at or above it is rejected.
    b = 2**63 + 1
    r = _Fed([2**63 + 1, top, 2**63])
    assert r.uniform_int(b) == 2**63 and r.words == []
    # bound 2**64 accepts every word; bound 1 always gives 0
    assert _Fed([top]).uniform_int(2**64) == top
    assert _Fed([12345]).uniform_int(1) == 0
    for bad in (0, -1, 2**64 + 1):
        with pytest.raises(ValueError):
            WordReader(KEY).uniform_int(bad)


def test_uniform_int_is_in_range_and_roughly_uniform() -> None:
    r = WordReader(KEY)
    counts = np.bincount([r.uniform_int(6) for _ in range(6000)], minlength=6)
    assert counts.sum() == 6000 and len(counts) == 6
    assert counts.min() > 850 and counts.max() < 1150


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 257])
def test_permutation_is_a_permutation(n: int) -> None:
    p = permutation(KEY, n)
    assert p.dtype == np.int64
    assert sorted(p.tolist()) == list(range(n))
    np.testing.assert_array_equal(p, permutation(KEY, n))


def test_permutation_depends_on_key() -> None:
    a = permutation(stream_key("sampler", 0, u64(0)), 100)
    b = permutation(stream_key("sampler", 0, u64(1)), 100)
    c = permutation(stream_key("sampler", 1, u64(0)), 100)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    assert not np.array_equal(a, np.arange(100))


def test_permutation_index_gives_the_shuffles_entries() -> None:
    """Every position of fresh keys and sizes (small ones, where the chains are long relative
    to ``n``, and a few larger), in any order and repeated, against the whole shuffle and the
    word-by-word definition of SPEC §5.3."""
    rng = np.random.default_rng(17)
    sizes = [*range(1, 40), 257, 1797, 4099]
    for n in sizes:
        for _ in range(3 if n < 40 else 1):
            key = rng.bytes(32)
            want = permutation(key, n)
            if n <= 257:
                np.testing.assert_array_equal(want, stream._permutation_sequential(key, n))
            idx = PermutationIndex(key, n)
            np.testing.assert_array_equal(idx.at(np.arange(n)), want)
            pos = rng.integers(0, n, size=min(3 * n, 300))
            got = idx.at(pos)
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, want[pos])
    idx = PermutationIndex(KEY, 10)
    assert idx.at(np.arange(0)).size == 0
    with pytest.raises(IndexError):
        idx.at(np.array([10]))
    with pytest.raises(IndexError):
        idx.at(np.array([-1]))


def test_permutation_index_falls_back_on_a_rejected_word(monkeypatch: pytest.MonkeyPatch) -> None:
    """A word at or above its bound's limit (SPEC §5.2) changes how the stream is consumed from
    there on: the index then uses the word-by-word shuffle, as :func:`permutation` does."""
    n = 50
    real = stream.stream_words

    def rejected(key: bytes, count: int) -> np.ndarray:
        w = real(key, count).copy()
        w[n - 1 - 2] = np.uint64(2**64 - 1)  # step i = 2: bound 3, limit 2^64 - 1
        return w

    monkeypatch.setattr(stream, "stream_words", rejected)
    assert stream._draws(KEY, n) is None
    want = stream._permutation_sequential(KEY, n)
    np.testing.assert_array_equal(permutation(KEY, n), want)
    np.testing.assert_array_equal(PermutationIndex(KEY, n).at(np.arange(n)), want)


def test_sample_without_replacement() -> None:
    for n, s in [(10, 0), (10, 3), (10, 10), (1000, 50), (1, 1)]:
        out = sample_without_replacement(KEY, n, s)
        assert len(out) == s == len(set(out))
        assert all(0 <= i < n for i in out)
        assert out == sample_without_replacement(KEY, n, s)
    # a partial shuffle: a smaller sample is a prefix of a larger one
    assert sample_without_replacement(KEY, 100, 20)[:5] == sample_without_replacement(KEY, 100, 5)
    assert sample_without_replacement(KEY, 100, 5) != sample_without_replacement(
        stream_key("x", 0), 100, 5
    )
    for n, s in [(3, 4), (3, -1)]:
        with pytest.raises(ValueError):
            sample_without_replacement(KEY, n, s)


def test_uniform_floats() -> None:
    u = uniform_floats(KEY, 10_000)
    assert u.dtype == np.float64 and ((u >= 0) & (u < 1)).all()
    assert 0.45 < u.mean() < 0.55
    w = stream_words(KEY, 4)
    np.testing.assert_array_equal(
        uniform_floats(KEY, 4), (w >> np.uint64(11)).astype(np.float64) / 2.0**53
    )


def test_permutation_index_takes_a_vector_of_integers() -> None:
    idx = PermutationIndex(KEY, 100)
    with pytest.raises(TypeError):
        idx.at(np.array([[1, 2]]))
    with pytest.raises(TypeError):
        idx.at(np.array([1.5]))
    np.testing.assert_array_equal(idx.at(np.array([3], dtype=np.uint8)), permutation(KEY, 100)[[3]])
