"""Hashing, Merkle trees, canonical encodings, streams and Ed25519 keys. No torch."""

from dk.crypto.encoding import encode_tensors as encode_tensors
from dk.crypto.encoding import tensors_root as tensors_root
from dk.crypto.hashing import digests_equal as digests_equal
from dk.crypto.hashing import tagged_hash as tagged_hash
from dk.crypto.keys import SigningKey as SigningKey
from dk.crypto.keys import VerifyKey as VerifyKey
from dk.crypto.merkle import InclusionProof as InclusionProof
from dk.crypto.merkle import MerkleTree as MerkleTree
from dk.crypto.merkle import merkle_root as merkle_root
from dk.crypto.merkle import verify_inclusion as verify_inclusion

__all__ = [
    "InclusionProof",
    "MerkleTree",
    "SigningKey",
    "VerifyKey",
    "digests_equal",
    "encode_tensors",
    "merkle_root",
    "tagged_hash",
    "tensors_root",
    "verify_inclusion",
]
