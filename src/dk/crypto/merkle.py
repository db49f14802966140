"""Binary Merkle tree over SHA-256 with domain-separated leaves and nodes (SPEC §3).

* leaf hash  = ``tagged_hash(TAG_LEAF, data)``
* node hash  = ``tagged_hash(TAG_NODE, left || right)``
* odd rule   = at a level with an odd number of nodes the last node is *promoted* unchanged
  to the next level (never duplicated, so no two leaf lists share a root: CVE-2012-2459);
* empty tree = ``tagged_hash(TAG_EMPTY, b"")``.

An inclusion proof is ``(index, size, path)``: the verifier re-derives from ``index`` and
``size`` which levels have a sibling and on which side, so a proof has no free bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dk.crypto.hashing import DIGEST_SIZE, TAG_EMPTY, TAG_LEAF, TAG_NODE, tagged_hash, tagged_hasher

_NODE = tagged_hasher(TAG_NODE)
_LEAF = tagged_hasher(TAG_LEAF)


def leaf_hash(data: bytes | bytearray | memoryview) -> bytes:
    """Hash one leaf's data (SPEC §3.1)."""
    h = _LEAF.copy()
    h.update(data)
    return h.digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """Hash two child digests into their parent (SPEC §3.1)."""
    h = _NODE.copy()
    h.update(left)
    h.update(right)
    return h.digest()


def empty_root() -> bytes:
    """Root of the tree with no leaves."""
    return tagged_hash(TAG_EMPTY, b"")


def _next_level(level: Sequence[bytes]) -> list[bytes]:
    nxt = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
    if len(level) % 2:
        nxt.append(level[-1])  # SPEC §3.1: promote the odd node
    return nxt


def merkle_root(leaf_hashes: Sequence[bytes]) -> bytes:
    """Root over already-hashed leaves."""
    if not leaf_hashes:
        return empty_root()
    level = list(leaf_hashes)
    while len(level) > 1:
        level = _next_level(level)
    return level[0]


@dataclass(frozen=True)
class InclusionProof:
    """Proof that the leaf at ``index`` of a ``size``-leaf tree hashes up to a root."""

    index: int
    size: int
    path: tuple[bytes, ...]

    def to_dict(self) -> dict[str, object]:
        """JSON form used in vectors and bundles."""
        return {"index": self.index, "size": self.size, "path": [p.hex() for p in self.path]}


class MerkleTree:
    """All levels of a tree, for building inclusion proofs."""

    def __init__(self, leaf_hashes: Sequence[bytes]) -> None:
        self.levels: list[list[bytes]] = [list(leaf_hashes)]
        while len(self.levels[-1]) > 1:
            self.levels.append(_next_level(self.levels[-1]))

    @property
    def size(self) -> int:
        """Number of leaves."""
        return len(self.levels[0])

    @property
    def root(self) -> bytes:
        """The tree's root."""
        return self.levels[-1][0] if self.size else empty_root()

    def proof(self, index: int) -> InclusionProof:
        """Inclusion proof of leaf ``index``."""
        if not 0 <= index < self.size:
            raise IndexError(f"leaf index {index} out of range for {self.size} leaves")
        path: list[bytes] = []
        i = index
        for level in self.levels[:-1]:
            sibling = i ^ 1
            if sibling < len(level):
                path.append(level[sibling])
            i //= 2
        return InclusionProof(index, self.size, tuple(path))


def verify_inclusion(leaf: bytes, proof: InclusionProof, root: bytes) -> bool:
    """Check that ``leaf`` (a leaf *hash*) is at ``proof.index`` under ``root`` (SPEC §3.2)."""
    from dk.crypto.hashing import digests_equal

    if not 0 <= proof.index < proof.size or len(leaf) != DIGEST_SIZE:
        return False
    h, i, n, k = leaf, proof.index, proof.size, 0
    while n > 1:
        if i % 2 == 1:
            if k >= len(proof.path):
                return False
            h = node_hash(proof.path[k], h)
            k += 1
        elif i + 1 < n:
            if k >= len(proof.path):
                return False
            h = node_hash(h, proof.path[k])
            k += 1
        # else: the odd last node is promoted with no sibling
        i //= 2
        n = (n + 1) // 2
    return (
        k == len(proof.path)
        and all(len(p) == DIGEST_SIZE for p in proof.path)
        and (digests_equal(h, root))
    )
