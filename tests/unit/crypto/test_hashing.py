"""Domain-separated hashing (SPEC §2): tags, boundaries, fixed-width encodings, hex digests."""

from __future__ import annotations

import hashlib
import struct

import pytest

from dk.crypto import hashing
from dk.crypto.hashing import digests_equal, f64, parse_hex_digest, tagged_hash, u64
from dk.errors import FormatError


def test_tagged_hash_is_sha256_of_length_prefixed_tag_and_data() -> None:
    tag, data = "dk/v1/job", b"payload"
    want = hashlib.sha256(bytes([len(tag)]) + tag.encode() + data).digest()
    assert tagged_hash(tag, data) == want
    assert tagged_hash(tag, b"pay", b"", b"load") == want  # parts are concatenated


def test_different_tags_give_different_digests() -> None:
    tags = [v for k, v in vars(hashing).items() if k.startswith("TAG_")]
    assert len(tags) == len(set(tags)) >= 10
    digests = {tagged_hash(t, b"same data") for t in tags}
    assert len(digests) == len(tags)


def test_tag_data_boundary_is_unambiguous() -> None:
    # Without the length prefix these two would hash the same byte string "dk/v1/ab" + "c".
    assert tagged_hash("dk/v1/ab", b"c") != tagged_hash("dk/v1/a", b"bc")
    assert tagged_hash("dk/v1/a", b"") != tagged_hash("dk/v1/", b"a")


@pytest.mark.parametrize("tag", ["", "x" * 256, "dk/v1/é"])
def test_bad_tags_are_refused(tag: str) -> None:
    with pytest.raises(ValueError):
        tagged_hash(tag, b"")


def test_fixed_width_encodings() -> None:
    assert u64(1) == b"\x01" + bytes(7)
    assert u64(2**64 - 1) == b"\xff" * 8
    assert f64(1.0) == struct.pack("<d", 1.0)
    assert f64(-0.0) != f64(0.0)
    with pytest.raises(struct.error):
        u64(-1)


def test_digests_equal() -> None:
    a = tagged_hash("dk/v1/job", b"a")
    assert digests_equal(a, bytes(a))
    assert digests_equal(a, bytearray(a))
    assert not digests_equal(a, tagged_hash("dk/v1/job", b"b"))
    assert not digests_equal(a, a[:31])


def test_parse_hex_digest() -> None:
    d = tagged_hash("dk/v1/job", b"x")
    assert parse_hex_digest(d.hex()) == d
    for bad in (d.hex().upper(), d.hex()[:-1], d.hex() + "0", "zz" * 32, None, 7, d):
        with pytest.raises(FormatError):
            parse_hex_digest(bad, what="root")


def test_spec_tag_table_is_the_codes_and_the_vectors_tags() -> None:
    """SPEC §2's table lists exactly Part I's tags: those ``dk.crypto.hashing`` defines and
    the model-source tag of ``dk.pol.modelsrc`` (§9.3); ``vectors/crypto/hashing.json`` hashes
    under every one of them (an implementer learns each tag from the table alone)."""
    import json
    import re
    from pathlib import Path

    from dk.pol.modelsrc import TAG_MODEL_SOURCE

    root = Path(__file__).resolve().parents[3]
    spec = (root / "SPEC.md").read_text(encoding="utf-8")
    section = spec[spec.index("\n## §2 Hashing") : spec.index("\n## §3 Merkle tree")]
    table = set(re.findall(r"^\| `(dk/v\d/[a-z/]+)` \|", section, re.M))
    code = {v for k, v in vars(hashing).items() if k.startswith("TAG_")} | {TAG_MODEL_SOURCE}
    assert table == code
    cases = json.loads((root / "vectors/crypto/hashing.json").read_text())["cases"]
    assert {c["tag"] for c in cases if c["result"] == "valid"} == table
