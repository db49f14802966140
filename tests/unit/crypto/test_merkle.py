"""Merkle trees (SPEC §3): roots against an independent recursive reference, odd-node
promotion, and inclusion proofs that break under every single change."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from dk.crypto.merkle import (
    InclusionProof,
    MerkleTree,
    empty_root,
    leaf_hash,
    merkle_root,
    node_hash,
    verify_inclusion,
)


def _h(tag: str, data: bytes) -> bytes:
    return hashlib.sha256(bytes([len(tag)]) + tag.encode() + data).digest()


def _ref_root(leaves: list[bytes]) -> bytes:
    """Reference root written from the SPEC text only: split at the largest power of two
    below n (the shape level-by-level pairing with odd-node promotion produces)."""
    if not leaves:
        return _h("dk/v1/merkle/empty", b"")
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while 2 * k < len(leaves):
        k *= 2
    return _h("dk/v1/merkle/node", _ref_root(leaves[:k]) + _ref_root(leaves[k:]))


def _leaves(n: int) -> list[bytes]:
    return [leaf_hash(f"leaf {i}".encode()) for i in range(n)]


def test_leaf_and_node_hashes_are_domain_separated() -> None:
    assert leaf_hash(b"x") == _h("dk/v1/merkle/leaf", b"x")
    a, b = leaf_hash(b"a"), leaf_hash(b"b")
    assert node_hash(a, b) == _h("dk/v1/merkle/node", a + b)
    assert leaf_hash(a + b) != node_hash(a, b)  # a 64-byte leaf is not an inner node
    assert empty_root() == _h("dk/v1/merkle/empty", b"")


@pytest.mark.parametrize("n", range(18))
def test_root_matches_recursive_reference(n: int) -> None:
    leaves = _leaves(n)
    assert merkle_root(leaves) == _ref_root(leaves)
    assert MerkleTree(leaves).root == merkle_root(leaves)
    assert MerkleTree(leaves).size == n


def test_odd_node_is_promoted_not_duplicated() -> None:
    a, b, c = _leaves(3)
    assert merkle_root([a, b, c]) == node_hash(node_hash(a, b), c)
    assert merkle_root([a, b, c]) != merkle_root([a, b, c, c])
    assert merkle_root([a]) == a
    assert merkle_root([a, b, c, c, c]) != merkle_root([a, b, c, c])


def test_root_depends_on_order_and_every_leaf() -> None:
    leaves = _leaves(9)
    root = merkle_root(leaves)
    assert merkle_root(leaves[::-1]) != root
    for i in range(len(leaves)):
        changed = list(leaves)
        changed[i] = leaf_hash(b"other")
        assert merkle_root(changed) != root


@pytest.mark.parametrize("n", range(1, 18))
def test_every_inclusion_proof_verifies(n: int) -> None:
    leaves = _leaves(n)
    tree = MerkleTree(leaves)
    for i, leaf in enumerate(leaves):
        proof = tree.proof(i)
        assert (proof.index, proof.size) == (i, n)
        assert verify_inclusion(leaf, proof, tree.root)
        d = proof.to_dict()
        assert d["path"] == [p.hex() for p in proof.path]


@pytest.mark.parametrize("n", [2, 3, 5, 7, 8, 13, 17])
def test_proofs_break_under_any_change(n: int) -> None:
    leaves = _leaves(n)
    tree = MerkleTree(leaves)
    root = tree.root
    for i, leaf in enumerate(leaves):
        p = tree.proof(i)
        # a different leaf, index or root
        assert not verify_inclusion(leaf_hash(b"forged"), p, root)
        assert not verify_inclusion(leaf, p, leaf_hash(b"other root"))
        for j in range(n):
            if j != i:
                assert not verify_inclusion(leaf, replace(p, index=j), root)
        assert not verify_inclusion(leaf, replace(p, index=-1), root)
        assert not verify_inclusion(leaf, replace(p, index=n), root)
        # a different tree size (same path)
        for m in range(1, 2 * n + 2):
            if m != n and _same_shape(i, n, m):
                continue
            if m != n:
                assert not verify_inclusion(leaf, replace(p, size=m), root)
        # each sibling changed, path reordered, truncated or extended
        for k in range(len(p.path)):
            path = list(p.path)
            path[k] = leaf_hash(b"bad sibling")
            assert not verify_inclusion(leaf, replace(p, path=tuple(path)), root)
        if len(set(p.path)) > 1:
            assert not verify_inclusion(leaf, replace(p, path=p.path[::-1]), root)
        if p.path:
            assert not verify_inclusion(leaf, replace(p, path=p.path[:-1]), root)
        assert not verify_inclusion(leaf, replace(p, path=(*p.path, root)), root)


def _same_shape(i: int, n: int, m: int) -> bool:
    """True when leaf ``i`` has the same sibling sides in trees of ``n`` and ``m`` leaves (a
    proof then legitimately verifies for both sizes)."""

    def sides(size: int) -> list[int]:
        out, idx = [], i
        while size > 1:
            if idx % 2 or idx + 1 < size:
                out.append(idx % 2)
            idx, size = idx // 2, (size + 1) // 2
        return out

    return i < m and sides(n) == sides(m)


def test_wrong_digest_sizes_are_rejected() -> None:
    leaves = _leaves(4)
    tree = MerkleTree(leaves)
    p = tree.proof(1)
    assert not verify_inclusion(leaves[1][:31], p, tree.root)
    assert not verify_inclusion(
        leaves[1], replace(p, path=(p.path[0] + b"\x00", *p.path[1:])), tree.root
    )


def test_single_leaf_and_out_of_range() -> None:
    (a,) = _leaves(1)
    tree = MerkleTree([a])
    assert tree.proof(0) == InclusionProof(0, 1, ())
    assert verify_inclusion(a, tree.proof(0), a)
    with pytest.raises(IndexError):
        tree.proof(1)
    with pytest.raises(IndexError):
        MerkleTree([]).proof(0)
    assert MerkleTree([]).root == empty_root()
    assert not verify_inclusion(a, InclusionProof(0, 0, ()), empty_root())
