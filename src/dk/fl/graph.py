"""Communication graphs for secure aggregation (SPEC §VII.2): complete (SecAgg) or SecAgg+.

SecAgg (Bonawitz et al., CCS 2017) pairs every client with every other. SecAgg+ (Bell, Bonawitz,
Gascón, Lepoint, Raykova, "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead",
CCS 2020) replaces the complete graph by a random ``k``-regular one with ``k = O(log n)``: a
client agrees keys, shares secrets and exchanges pair masks with its ``k`` neighbours only, so
its work and messages are ``O(log n + d)`` instead of ``O(n + d)``.

dk instantiates the paper's random sparse graph as the Harary graph ``H(k, n)`` (position ``i``
adjacent to ``i ± 1 … i ± k/2`` mod ``n``) under a uniformly random relabelling, so every
neighbourhood has exactly ``k`` members; the relabelling is a
Fisher–Yates shuffle driven by ChaCha20 keyed with ``SHA-256(TAG_GRAPH || session)``, so every
party derives the same graph from the round's session bytes.
"""

from __future__ import annotations

import hashlib
import math

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

TAG_GRAPH = b"dk/v1/secagg+/graph"
Graph = tuple[frozenset[int], ...]

__all__ = ["Graph", "complete_graph", "default_degree", "harary_graph", "make_graph", "permutation"]


def complete_graph(n: int) -> Graph:
    """Every client adjacent to every other (SecAgg)."""
    return tuple(frozenset(range(n)) - {u} for u in range(n))


def default_degree(n: int) -> int:
    """SecAgg+'s default degree ``k = 2⌈log2 n⌉`` (even; ``n - 1`` when that is smaller)."""
    if n < 2:
        raise ValueError("a graph needs at least 2 clients")
    return min(n - 1, 2 * math.ceil(math.log2(n)))


def permutation(n: int, session: bytes) -> list[int]:
    """The relabelling ``π`` of SPEC §VII.2: Fisher–Yates from ``i = n-1`` down to 1 with
    ``j`` uniform on ``[0, i]`` (little-endian uint32 words of the ChaCha20 keystream, zero
    nonce‖counter, key ``SHA-256(TAG_GRAPH || session)``; a word ``w`` is kept when
    ``w < 2^32 - 2^32 mod (i+1)``, then ``j = w mod (i+1)``)."""
    key = hashlib.sha256(TAG_GRAPH + session).digest()
    enc = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        m = i + 1
        limit = (1 << 32) - (1 << 32) % m
        while True:
            w = int.from_bytes(enc.update(bytes(4)), "little")
            if w < limit:
                break
        j = w % m
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def harary_graph(n: int, k: int, session: bytes) -> Graph:
    """``H(k, n)`` relabelled by :func:`permutation`: client ``perm[i]`` sits at position ``i``.

    Raises:
        ValueError: ``k`` is odd and below ``n - 1``, or not in ``[2, n - 1]``.
    """
    if not 2 <= n or not 1 <= k <= n - 1:
        raise ValueError(f"need 1 <= k <= n - 1, got k={k}, n={n}")
    if k == n - 1:
        return complete_graph(n)
    if k % 2:
        raise ValueError(f"the SecAgg+ degree k must be even (or n - 1), got {k}")
    perm = permutation(n, session)
    nbrs: list[set[int]] = [set() for _ in range(n)]
    for i in range(n):
        for j in range(1, k // 2 + 1):
            a, b = perm[i], perm[(i + j) % n]
            nbrs[a].add(b)
            nbrs[b].add(a)
    return tuple(frozenset(s) for s in nbrs)


def make_graph(n: int, session: bytes, degree: int | None) -> Graph:
    """``degree=None``: the complete graph (SecAgg); else SecAgg+'s graph of that degree."""
    return complete_graph(n) if degree is None else harary_graph(n, degree, session)
