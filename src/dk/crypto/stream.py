"""A fully specified pseudo-random stream: ChaCha20 keyed by a tagged hash (SPEC §5).

dk never uses numpy's or torch's generators for anything a verifier must re-derive. A stream
is named by ``(purpose, seed, label)``::

    key    = tagged_hash(TAG_STREAM, u8(len(purpose)) || purpose || u64(seed) || label)
    words  = ChaCha20(key, counter=0, nonce=0^12) keystream, read as little-endian u64

(RFC 8439 block function; ``cryptography``'s ChaCha20 takes the 16-byte counter||nonce.)
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher
from cryptography.hazmat.primitives.ciphers.algorithms import ChaCha20

from dk.crypto.hashing import TAG_STREAM, tagged_hash, u64

_TWO64 = 1 << 64


def stream_key(purpose: str, seed: int, label: bytes = b"") -> bytes:
    """The 32-byte ChaCha20 key of a named stream."""
    p = purpose.encode("ascii")
    if not 0 < len(p) < 256:
        raise ValueError("purpose must be 1..255 ASCII bytes")
    if not 0 <= seed < _TWO64:
        raise ValueError("seed must fit in an unsigned 64-bit integer")
    return tagged_hash(TAG_STREAM, bytes([len(p)]), p, u64(seed), label)


def keystream(key: bytes, nbytes: int, *, offset_blocks: int = 0) -> bytes:
    """``nbytes`` of ChaCha20 keystream starting at 64-byte block ``offset_blocks``."""
    nonce = offset_blocks.to_bytes(4, "little") + b"\x00" * 12
    enc = Cipher(ChaCha20(key, nonce), mode=None).encryptor()
    return enc.update(b"\x00" * nbytes)


def stream_words(key: bytes, n: int) -> np.ndarray:
    """The first ``n`` u64 words of the stream with ``key``."""
    return np.frombuffer(keystream(key, 8 * n), dtype="<u8").astype(np.uint64)


class WordReader:
    """Sequential reader of a stream's u64 words, with unbiased bounded integers."""

    _BLOCK_WORDS = 512

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._buf: list[int] = []
        self._pos = 0
        self._blocks = 0

    def next_word(self) -> int:
        """The next u64 word."""
        if self._pos >= len(self._buf):
            nbytes = 8 * self._BLOCK_WORDS
            raw = keystream(self._key, nbytes, offset_blocks=self._blocks)
            self._blocks += nbytes // 64
            self._buf = np.frombuffer(raw, dtype="<u8").tolist()
            self._pos = 0
        w = self._buf[self._pos]
        self._pos += 1
        return int(w)

    def uniform_int(self, bound: int) -> int:
        """Uniform integer in ``[0, bound)`` by rejection (SPEC §5.2)."""
        if not 0 < bound <= _TWO64:
            raise ValueError("bound out of range")
        limit = _TWO64 - (_TWO64 % bound)
        while True:
            w = self.next_word()
            if w < limit:
                return w % bound


def _permutation_sequential(key: bytes, n: int) -> np.ndarray:
    r = WordReader(key)
    a = list(range(n))
    for i in range(n - 1, 0, -1):
        j = r.uniform_int(i + 1)
        a[i], a[j] = a[j], a[i]
    return np.asarray(a, dtype=np.int64)


def permutation(key: bytes, n: int) -> np.ndarray:
    """Fisher–Yates permutation of ``range(n)`` driven by the stream (SPEC §5.3).

    Fast path: draw the ``n - 1`` words at once and reduce them with NumPy; if any word hits
    a rejection (probability about ``n² / 2⁶⁴``), fall back to the word-by-word definition,
    which consumes the stream differently from then on. Both paths give the SPEC's result.
    """
    if n <= 1:
        return np.arange(n, dtype=np.int64)
    if n >= 1 << 32:
        return _permutation_sequential(key, n)
    j = _draws(key, n)
    if j is None:
        return _permutation_sequential(key, n)
    a = list(range(n))
    for i, ji in zip(range(n - 1, 0, -1), j[:0:-1].tolist(), strict=True):
        a[i], a[ji] = a[ji], a[i]
    return np.asarray(a, dtype=np.int64)


def _draws(key: bytes, n: int) -> np.ndarray | None:
    """``j`` of every step of :func:`permutation` (``out[i]`` for ``i = 1 .. n - 1``; ``out[0]
    = 0``) when the ``n - 1`` words hit no rejection (then word ``k`` is step ``n - 1 - k``'s),
    else None."""
    w = stream_words(key, n - 1)
    bounds = np.arange(n, 1, -1, dtype=np.uint64)  # i + 1 for i = n-1 .. 1
    limits = np.uint64(0) - (np.uint64(0) - bounds) % bounds  # 2^64 - (2^64 mod b), mod 2^64
    if not np.all((w < limits) | (limits == 0)):
        return None
    j = np.zeros(n, dtype=np.int64)
    j[:0:-1] = (w % bounds).astype(np.int64)  # j[n-1] from word 0, ..., j[1] from word n-2
    return j


class PermutationIndex:
    """Entries of :func:`permutation` ``(key, n)`` without running the whole shuffle.

    A verifier needs a few batches of an epoch's permutation (SPEC §8), not all ``n`` entries;
    the shuffle's Python loop costs about 1 s at ``n = 1.28 M``. Position ``p`` is final once
    step ``i = p`` has swapped it, and holds what position ``j_p`` held just before that step.
    Position ``x <= i`` was last written, before step ``i``, by the step ``t > i`` with
    ``j_t = x`` that ran last, i.e. the least such ``t``; that step moved in what position ``t``
    held just before step ``t``; if no step chose ``x``, it still holds ``x``. So ``a[p]``
    follows the chain ``(x, i) = (j_p, p) -> (t, t) -> ...`` until no step chose ``x``; steps
    are indexed by ``(j_t, t)``, sorted once (``O(n log n)``, vectorised), and each link is a
    binary search. The values are :func:`permutation`'s (tests compare them); a rejection
    among the words, or ``n`` outside ``[2, 2**31)``, falls back to the whole shuffle.
    """

    def __init__(self, key: bytes, n: int) -> None:
        self.n = n
        self._full: np.ndarray | None = None
        j = _draws(key, n) if 2 <= n < 1 << 31 else None
        if j is None:
            self._full = permutation(key, n)
            return
        self._j = j.astype(np.int32)  # 4 + 8 bytes an entry with the keys (the shuffle: 8)
        steps = np.arange(1, n, dtype=np.int64)
        self._keys = np.sort(j[1:] * n + steps)  # (j_t, t) as one integer, n**2 < 2**62

    def at(self, positions: np.ndarray) -> np.ndarray:
        """``permutation(key, n)[positions]`` as int64 (``positions`` in ``[0, n)``)."""
        given = np.asarray(positions)
        if given.ndim != 1 or (given.size and given.dtype.kind not in "iu"):
            raise TypeError("positions must be a 1-D array of integers")
        p: np.ndarray = given.astype(np.int64)
        if p.size and (p.min() < 0 or p.max() >= self.n):
            raise IndexError("permutation position out of range")
        if self._full is not None:
            whole: np.ndarray = self._full[p]
            return whole
        n, keys = self.n, self._keys
        x: np.ndarray = self._j[p].astype(np.int64)  # the chain's (x, i); p = 0: j_0 = 0, i = 0
        i = p.copy()
        live = np.arange(p.size)
        while live.size:
            xs = x[live]
            at = np.searchsorted(keys, xs * n + i[live] + 1)  # first (j_t, t) > (x, i)
            found = at < keys.size
            k = keys[np.minimum(at, keys.size - 1)]
            found &= k // n == xs  # a step t > i chose x
            live = live[found]
            t = k[found] % n
            x[live], i[live] = t, t
        return x


def sample_without_replacement(key: bytes, n: int, s: int) -> list[int]:
    """First ``s`` entries of a partial Fisher–Yates shuffle of ``range(n)`` (SPEC §5.4)."""
    if not 0 <= s <= n:
        raise ValueError("sample size out of range")
    r = WordReader(key)
    a = list(range(n))
    for i in range(s):
        j = i + r.uniform_int(n - i)
        a[i], a[j] = a[j], a[i]
    return a[:s]


def uniform_floats(key: bytes, n: int) -> np.ndarray:
    """``n`` float64 values in ``[0, 1)``: ``(w >> 11) * 2**-53`` (SPEC §5.5)."""
    w = stream_words(key, n)
    return (w >> np.uint64(11)).astype(np.float64) * (2.0**-53)
