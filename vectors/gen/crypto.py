"""Generator of the crypto vectors (SPEC §1.3-§5, §11.4): ``vectors/crypto/*.json``.

Everything is derived from fixed inputs (no randomness, no clock), so a rerun on an unchanged
format rewrites identical files. Invalid cases are mutations of valid ones; each is kept only
after checking that the library rejects it (a mutation that happens to stay valid under the
SPEC, such as a Merkle proof re-read with a size whose walk is identical, is skipped).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dk.crypto import hashing
from dk.crypto.canonical_json import canonical_json, parse_json
from dk.crypto.encoding import CHUNK_SIZE, decode_tensors, encode_tensors, tensors_root
from dk.crypto.keys import SigningKey, VerifyKey
from dk.crypto.merkle import InclusionProof, MerkleTree, leaf_hash, merkle_root, verify_inclusion
from dk.crypto.stream import (
    keystream,
    permutation,
    sample_without_replacement,
    stream_key,
    stream_words,
    uniform_floats,
)
from dk.pol.modelsrc import TAG_MODEL_SOURCE
from dk.pol.transcript import signing_digest
from dk.vectors import write_cases
from dk.vectors.crypto import (
    ED25519_L,
    RFC8032_TEST1,
    RFC8439_ZERO_KEY_BLOCKS,
    CountingReader,
    build_tensor_set,
)

Case = dict[str, Any]

SPEC_TAGS = [
    hashing.TAG_LEAF,
    hashing.TAG_NODE,
    hashing.TAG_EMPTY,
    hashing.TAG_STREAM,
    hashing.TAG_SAMPLE,
    hashing.TAG_JOB,
    hashing.TAG_BATCH,
    hashing.TAG_TRANSCRIPT_HEADER,
    hashing.TAG_TRANSCRIPT_LEAF,
    hashing.TAG_TRANSCRIPT_EXT,
    TAG_MODEL_SOURCE,
    hashing.TAG_SIGNATURE,
    hashing.TAG_CHALLENGE,
    hashing.TAG_REPORT,
    hashing.TAG_ATTESTATION,
    hashing.TAG_RANK,
    hashing.TAG_RANK_GRAD,
    hashing.TAG_RANK_INTERVAL,
]


def _number(cases: list[Case]) -> list[Case]:
    for i, c in enumerate(cases, 1):
        c["tcId"] = i
    return cases


def _raises(fn: Callable[[], object]) -> str | None:
    try:
        fn()
    except Exception as e:  # the generator records which class the library raises
        return type(e).__name__
    return None


# --- §2 tagged hashes ------------------------------------------------------------------------


def hashing_cases() -> list[Case]:
    """Tagged hashes of every SPEC tag over a few messages; invalid tags and digests."""
    cases: list[Case] = []
    for tag in SPEC_TAGS:
        for data in (b"", b"abc", bytes(range(64))):
            cases.append(
                {
                    "comment": f"tag {tag}, {len(data)}-byte message",
                    "result": "valid",
                    "tag": tag,
                    "data": data.hex(),
                    "digest": hashing.tagged_hash(tag, data).hex(),
                }
            )
    import hashlib

    untagged = hashlib.sha256(b"dk/v1/job" + b"abc").hexdigest()
    cases.append(
        {
            "comment": "tag without its length byte (no domain separation)",
            "result": "invalid",
            "expected_reason": "DIGEST_MISMATCH",
            "tag": "dk/v1/job",
            "data": b"abc".hex(),
            "digest": untagged,
        }
    )
    shifted = hashing.tagged_hash("dk/v1/jo", b"babc").hex()
    cases.append(
        {
            "comment": "tag/data boundary moved by one byte",
            "result": "invalid",
            "expected_reason": "DIGEST_MISMATCH",
            "tag": "dk/v1/job",
            "data": b"abc".hex(),
            "digest": shifted,
        }
    )
    for tag, why in (("", "empty tag"), ("x" * 256, "tag of 256 bytes")):
        cases.append(
            {
                "comment": why,
                "result": "invalid",
                "expected_reason": "ValueError",
                "tag": tag,
                "data": "",
            }
        )
    return _number(cases)


# --- §1.3 canonical JSON ----------------------------------------------------------------------


# RFC 8785 Appendix B: binary64 (big-endian hex) and its canonical text.
RFC8785_NUMBERS = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


def canonical_json_cases() -> list[Case]:
    """Canonical encodings of parsed documents, and documents a strict parser must reject."""
    docs = [
        ('{"b": 1, "a": 2}', "keys sorted"),
        ('{"z": {"y": [3, 2, 1], "x": null}, "a": true, "m": false}', "nested objects, literals"),
        (
            '{"lr": 0.05, "eps": 1e-08, "big": 1e20, "one": 1.0, "negz": -0.0, "e16": 1e16,'
            ' "e21": 1e21, "tiny": 0.000001, "tinier": 1E-7, "frac": 1.50}',
            "floats as ECMAScript Number.prototype.toString (RFC 8785 §3.2.2.3)",
        ),
        (
            '{"max": 18446744073709551615, "min": -18446744073709551615,'
            ' "seed": 9223372036854775807, "neg": -7, "zero": 0,'
            ' "as_float": 18446744073709551616, "e": 2e0}',
            "integers below 2^64 in plain decimal; a 2^64 token is binary64 (SPEC §1.3)",
        ),
        (
            '{"\\u00e9": 1, "e": 2, "\\ud83d\\ude00": 3, "\\uffff": 4, "\\ue000": 5}',
            "non-ASCII keys sorted by UTF-16 code units (U+1F600 before U+E000)",
        ),
        (
            '{"\\u20ac": "Euro Sign", "\\r": "Carriage Return",'
            ' "\\ufb33": "Hebrew Letter Dalet With Dagesh", "1": "One",'
            ' "\\ud83d\\ude00": "Emoji: Grinning Face", "\\u0080": "Control",'
            ' "\\u00f6": "Latin Small Letter O With Diaeresis"}',
            "RFC 8785 §3.2.3 sorting example",
        ),
        (
            '["caf\\u00e9", "\\u0001", "tab\\t", "quote\\"", "back\\\\slash", "\\u2028"]',
            "strings: UTF-8 unescaped, control characters escaped",
        ),
        ("[]", "empty array"),
        ("{}", "empty object"),
        ("[" * 32 + "]" * 32, "32 nested arrays"),
        ('["/", "\\u007f", "\\u001f", "\\b\\f\\n\\r\\t"]', "JSON.stringify escapes"),
    ]
    cases: list[Case] = []
    for text, why in docs:
        value = parse_json(text.encode(), limit=1 << 20)
        cases.append(
            {
                "comment": why,
                "result": "valid",
                "input": text.encode().hex(),
                "canonical": canonical_json(value).hex(),
            }
        )
    for ieee, text in RFC8785_NUMBERS:
        value = struct.unpack(">d", bytes.fromhex(ieee))[0]
        assert canonical_json(value) == text.encode(), (ieee, text)
        cases.append(
            {
                "comment": f"RFC 8785 Appendix B: binary64 {ieee}",
                "result": "valid",
                "op": "number",
                "f64": ieee,
                "canonical": text.encode().hex(),
            }
        )
    for ieee, why in [("7fffffffffffffff", "NaN"), ("7ff0000000000000", "Infinity")]:
        value = struct.unpack(">d", bytes.fromhex(ieee))[0]
        assert _raises(lambda v=value: canonical_json(v)) == "FormatError"
        cases.append(
            {
                "comment": f"RFC 8785 Appendix B: {why} has no encoding",
                "result": "invalid",
                "expected_reason": "FormatError",
                "op": "number",
                "f64": ieee,
            }
        )
    bad: list[tuple[bytes, str]] = [
        (b'{"a": 1, "a": 2}', "duplicate key"),
        (b'{"a": {"b": 1, "b": 1}}', "nested duplicate key"),
        (b'{"a": NaN}', "NaN literal"),
        (b"[Infinity]", "Infinity literal"),
        (b"[-Infinity]", "-Infinity literal"),
        (b'{"a": "\xff"}', "invalid UTF-8 byte"),
        (b'{"a": "\xc3"}', "truncated UTF-8 sequence"),
        (b'{"a": 1e999}', "number overflowing to infinity"),
        (b"[" * 33 + b"]" * 33, "33 nested arrays (deeper than 32)"),
        (b"[" * 34 + b"]" * 34, "34 nested arrays"),
        (b'["\\ud800"]', "lone high surrogate escape"),
        (b'["\\udc00\\ud800"]', "surrogate escapes in the wrong order"),
        (b'{"a": 1', "truncated document"),
        (b'{"a": 1} x', "trailing garbage"),
    ]
    for data, why in bad:
        err = _raises(lambda d=data: parse_json(d, limit=1 << 20))
        assert err == "FormatError", (why, err)
        cases.append(
            {
                "comment": why,
                "result": "invalid",
                "expected_reason": "FormatError",
                "input": data.hex(),
                "limit": 1 << 20,
            }
        )
    over = b'{"pad": "' + b"x" * 100 + b'"}'
    cases.append(
        {
            "comment": "document over its byte limit",
            "result": "invalid",
            "expected_reason": "FormatError",
            "input": over.hex(),
            "limit": len(over) - 1,
        }
    )
    return _number(cases)


# --- §4 tensor encoding -----------------------------------------------------------------------

TENSOR_SETS: list[tuple[str, dict[str, Any]]] = [
    ("empty set", {}),
    ("0-d float32", {"a": {"dtype": "float32", "shape": [], "fill": "arange"}}),
    (
        "every dtype, names out of insertion order",
        {
            "u8": {"dtype": "uint8", "shape": [3], "fill": "arange"},
            "f32": {"dtype": "float32", "shape": [2, 3], "fill": "arange"},
            "f64": {"dtype": "float64", "shape": [2], "fill": "arange"},
            "i64": {"dtype": "int64", "shape": [2, 1], "fill": "arange_neg"},
            "i32": {"dtype": "int32", "shape": [1, 1, 2], "fill": "arange_neg"},
            "u64": {"dtype": "uint64", "shape": [2], "fill": "arange"},
        },
    ),
    ("zero-size tensor", {"empty": {"dtype": "float32", "shape": [0, 4], "fill": "arange"}}),
    (
        "special floats (NaN, inf, -0.0, the least float32 subnormal, -inf) encode bit-exactly",
        {"s": {"dtype": "float32", "shape": [5], "fill": "specials"}},
    ),
    (
        "names sorted by UTF-8 bytes, not insertion order",
        {
            "model/fc0.weight": {"dtype": "float32", "shape": [2, 2], "fill": "arange"},
            "meta/step": {"dtype": "int64", "shape": [], "fill": "arange"},
            "Z": {"dtype": "uint8", "shape": [1], "fill": "arange"},
            "\u00e9": {"dtype": "uint8", "shape": [1], "fill": "arange"},
        },
    ),
    (
        "8 dimensions",
        {"r8": {"dtype": "uint8", "shape": [1, 2, 1, 2, 1, 2, 1, 1], "fill": "arange"}},
    ),
    # Multi-chunk sets are stored as recipes: only the prefix, SHA-256 and root of the stream.
    (
        "stream of exactly one chunk (65536 bytes)",
        {"w": {"dtype": "uint8", "shape": [CHUNK_SIZE - 27], "fill": "arange"}},
    ),
    (
        "stream one byte over a chunk (second chunk of 1 byte)",
        {"w": {"dtype": "uint8", "shape": [CHUNK_SIZE - 26], "fill": "arange"}},
    ),
    (
        "arange(20000, float32): two chunks",
        {"w": {"dtype": "float32", "shape": [20000], "fill": "arange"}},
    ),
    (
        "three tensors straddling chunk boundaries",
        {
            "a": {"dtype": "float32", "shape": [16380], "fill": "arange"},
            "b": {"dtype": "int64", "shape": [100, 100], "fill": "arange_neg"},
            "c": {"dtype": "float64", "shape": [3], "fill": "specials"},
        },
    ),
]

INLINE_LIMIT = 4096


def encoding_cases() -> list[Case]:
    """Streams and roots of tensor sets; invalid sets and invalid streams."""
    cases: list[Case] = []
    for why, spec in TENSOR_SETS:
        tensors = build_tensor_set(spec)
        stream = encode_tensors(tensors)
        case: Case = {
            "comment": why,
            "result": "valid",
            "tensors": spec,
            "stream_len": len(stream),
            "chunks": -(-len(stream) // CHUNK_SIZE),
            "root": tensors_root(tensors).hex(),
        }
        if len(stream) <= INLINE_LIMIT:
            case["stream"] = stream.hex()
        else:
            import hashlib

            case["stream_prefix"] = stream[:64].hex()
            case["stream_sha256"] = hashlib.sha256(stream).hexdigest()
        cases.append(case)
    base = {"b": {"dtype": "float32", "shape": [2], "fill": "arange"}}
    wrong_chunk = tensors_root(build_tensor_set(TENSOR_SETS[9][1]), chunk_size=4096).hex()
    cases.append(
        {
            "comment": "root over 4096-byte chunks: the chunk size is fixed at 65536",
            "result": "invalid",
            "expected_reason": "ROOT_MISMATCH",
            "tensors": TENSOR_SETS[9][1],
            "root": wrong_chunk,
        }
    )
    flat = {"w": {"dtype": "float32", "shape": [20000], "fill": "arange"}}
    whole = merkle_root([leaf_hash(encode_tensors(build_tensor_set(flat)))]).hex()
    cases.append(
        {
            "comment": "root over the unchunked stream",
            "result": "invalid",
            "expected_reason": "ROOT_MISMATCH",
            "tensors": flat,
            "root": whole,
        }
    )
    for why, spec in (
        ("float16 is not encodable", {"h": {"dtype": "float16", "shape": [2], "fill": "arange"}}),
        ("bool is not encodable", {"h": {"dtype": "bool", "shape": [2], "fill": "arange"}}),
        ("9 dimensions", {"r9": {"dtype": "uint8", "shape": [1] * 9, "fill": "arange"}}),
        ("empty name", {"": {"dtype": "uint8", "shape": [1], "fill": "arange"}}),
        ("name of 1025 bytes", {"n" * 1025: {"dtype": "uint8", "shape": [1], "fill": "arange"}}),
    ):
        err = _raises(lambda s=spec: encode_tensors(build_tensor_set(s)))
        assert err == "FormatError", (why, err)
        cases.append(
            {
                "comment": why,
                "result": "invalid",
                "expected_reason": "FormatError",
                "op": "encode",
                "tensors": spec,
            }
        )
    good = encode_tensors(
        build_tensor_set({**base, "a": {"dtype": "int64", "shape": [1], "fill": "arange"}})
    )
    for why, data in _bad_streams(good):
        err = _raises(lambda d=data: decode_tensors(d))
        assert err == "FormatError", (why, err)
        cases.append(
            {
                "comment": why,
                "result": "invalid",
                "expected_reason": "FormatError",
                "op": "decode",
                "stream": data.hex(),
            }
        )
    return _number(cases)


def _tensor_bytes(name: bytes, code: int, shape: tuple[int, ...], data: bytes) -> bytes:
    return (
        struct.pack("<I", len(name))
        + name
        + bytes([code, len(shape)])
        + b"".join(struct.pack("<Q", d) for d in shape)
        + data
    )


def _bad_streams(good: bytes) -> list[tuple[str, bytes]]:
    """Streams a decoder MUST reject (SPEC §4.1)."""
    one = np.arange(2, dtype="<f4").tobytes()
    a = _tensor_bytes(b"a", 3, (1,), np.zeros(1, "<i8").tobytes())
    b = _tensor_bytes(b"b", 1, (2,), one)
    head2 = b"DKT1" + struct.pack("<Q", 2)
    return [
        ("bad magic", b"DKT2" + good[4:]),
        ("stream shorter than its prefix", b"DKT1\x00"),
        ("names out of order", head2 + b + a),
        ("duplicate names", head2 + a + a),
        ("unknown dtype code 7", head2 + a + _tensor_bytes(b"b", 7, (2,), one)),
        ("dtype code 0", head2 + a + _tensor_bytes(b"b", 0, (2,), one)),
        ("rank 9", b"DKT1" + struct.pack("<Q", 1) + _tensor_bytes(b"a", 4, (1,) * 9, b"\x00")),
        ("data truncated by one byte", good[:-1]),
        ("trailing byte", good + b"\x00"),
        ("count larger than the tensors present", b"DKT1" + struct.pack("<Q", 3) + good[12:]),
        ("zero-length name", b"DKT1" + struct.pack("<Q", 1) + _tensor_bytes(b"", 4, (1,), b"\x00")),
        (
            "name not UTF-8",
            b"DKT1" + struct.pack("<Q", 1) + _tensor_bytes(b"\xff", 4, (1,), b"\x00"),
        ),
    ]


# --- §3 Merkle trees --------------------------------------------------------------------------


def _leaves(n: int) -> list[bytes]:
    return [bytes([i]) * (i + 1) for i in range(n)]


def merkle_root_cases() -> list[Case]:
    """Roots over 0..9 leaves; duplicated-odd-node and untagged roots are invalid."""
    cases: list[Case] = []
    for n in range(10):
        data = _leaves(n)
        cases.append(
            {
                "comment": f"{n} leaves",
                "result": "valid",
                "leaves": [d.hex() for d in data],
                "root": merkle_root([leaf_hash(d) for d in data]).hex(),
            }
        )
    import hashlib

    for n in (3, 5, 7):
        level = [leaf_hash(d) for d in _leaves(n)]
        while len(level) > 1:
            if len(level) % 2:
                level = [*level, level[-1]]  # Bitcoin's rule, forbidden by SPEC §3.1
            level = [
                hashing.tagged_hash(hashing.TAG_NODE, level[i], level[i + 1])
                for i in range(0, len(level), 2)
            ]
        cases.append(
            {
                "comment": f"{n} leaves, odd node duplicated instead of promoted",
                "result": "invalid",
                "expected_reason": "ROOT_MISMATCH",
                "leaves": [d.hex() for d in _leaves(n)],
                "root": level[0].hex(),
            }
        )
    plain = [hashlib.sha256(d).digest() for d in _leaves(4)]
    lvl = [
        hashlib.sha256(plain[0] + plain[1]).digest(),
        hashlib.sha256(plain[2] + plain[3]).digest(),
    ]
    cases.append(
        {
            "comment": "4 leaves hashed without tags",
            "result": "invalid",
            "expected_reason": "ROOT_MISMATCH",
            "leaves": [d.hex() for d in _leaves(4)],
            "root": hashlib.sha256(lvl[0] + lvl[1]).hexdigest(),
        }
    )
    cases.append(
        {
            "comment": "0 leaves: the empty root is tagged, not SHA-256 of nothing",
            "result": "invalid",
            "expected_reason": "ROOT_MISMATCH",
            "leaves": [],
            "root": hashlib.sha256(b"").hexdigest(),
        }
    )
    return _number(cases)


def _proof_case(
    why: str, leaf: bytes, root: bytes, index: int, size: int, path: list[bytes], result: str
) -> Case:
    c: Case = {
        "comment": why,
        "result": result,
        "leaf_hash": leaf.hex(),
        "root": root.hex(),
        "index": index,
        "size": size,
        "path": [p.hex() for p in path],
    }
    if result == "invalid":
        c["expected_reason"] = "PROOF_INVALID"
    return c


MUTATED_SIZES = (1, 2, 3, 5, 6, 9)  # promoted nodes at levels 0, 1 and 2


def merkle_proof_cases() -> list[Case]:
    """A valid proof for every leaf of 1..9-leaf trees and mutated proofs that must fail."""
    cases: list[Case] = []
    invalid: list[Case] = []
    for n in range(1, 10):
        hashes = [leaf_hash(d) for d in _leaves(n)]
        tree = MerkleTree(hashes)
        for i in range(n):
            p = tree.proof(i)
            path = list(p.path)
            cases.append(_proof_case(f"n={n}, leaf {i}", hashes[i], tree.root, i, n, path, "valid"))
            if n not in MUTATED_SIZES:
                continue
            for why, (idx, size, mpath) in _mutations(i, n, path).items():
                ok = verify_inclusion(hashes[i], InclusionProof(idx, size, tuple(mpath)), tree.root)
                if not ok:
                    invalid.append(
                        _proof_case(
                            f"n={n}, leaf {i}: {why}",
                            hashes[i],
                            tree.root,
                            idx,
                            size,
                            mpath,
                            "invalid",
                        )
                    )
        if n >= 2:
            other = leaf_hash(b"not a leaf")
            p = tree.proof(0)
            invalid.append(
                _proof_case(
                    f"n={n}: leaf not in the tree", other, tree.root, 0, n, list(p.path), "invalid"
                )
            )
    return _number(cases + invalid)


def _mutations(i: int, n: int, path: list[bytes]) -> dict[str, tuple[int, int, list[bytes]]]:
    out: dict[str, tuple[int, int, list[bytes]]] = {
        "index equal to size": (n, n, path),
        "extra path element": (i, n, [*path, bytes(32)]),
        "size 0": (i, 0, path),
    }
    if n > 1:
        out["wrong index"] = ((i + 1) % n, n, path)
        out["wrong size (+1)"] = (i, n + 1, path)
        if i < n - 1:
            out["wrong size (-1)"] = (i, n - 1, path)
    if path:
        flipped = bytearray(path[0])
        flipped[0] ^= 0x01
        out["flipped sibling byte"] = (i, n, [bytes(flipped), *path[1:]])
        out["missing path element"] = (i, n, path[:-1])
        out["sibling of 31 bytes"] = (i, n, [path[0][:31], *path[1:]])
    if len(path) >= 2:
        out["swapped path order"] = (i, n, [path[1], path[0], *path[2:]])
    return out


# --- §5 streams -------------------------------------------------------------------------------


def stream_cases() -> list[Case]:
    """ChaCha20 keystream, stream keys, words, bounded integers, permutations, samples, floats."""
    cases: list[Case] = []
    ks = keystream(bytes(32), 128)
    assert ks.hex() == "".join(RFC8439_ZERO_KEY_BLOCKS)
    cases.append(
        {
            "comment": "RFC 8439 A.1 test vectors #1 and #2 (zero key, nonce 0, counters 0, 1)",
            "result": "valid",
            "op": "chacha20",
            "key": bytes(32).hex(),
            "keystream": ks.hex(),
        }
    )
    names = [
        ("sampler", 0, b"\x00" * 8),
        ("sampler", 42, hashing.u64(3)),
        ("init", 7, b"fc0.weight"),
        ("challenge", 0, bytes(range(32))),
        ("x", (1 << 64) - 1, b""),
    ]
    for purpose, seed, label in names:
        key = stream_key(purpose, seed, label)
        cases.append(
            {
                "comment": f"stream ({purpose}, {seed}, {len(label)}-byte label)",
                "result": "valid",
                "op": "stream_key",
                "purpose": purpose,
                "seed": str(seed),
                "label": label.hex(),
                "key": key.hex(),
                "words": [str(int(w)) for w in stream_words(key, 9)],
            }
        )
    for purpose, seed, why in (
        ("", 0, "empty purpose"),
        ("p" * 256, 0, "purpose of 256 bytes"),
        ("x", 1 << 64, "seed of 2^64"),
        ("x", -1, "negative seed"),
    ):
        assert _raises(lambda p=purpose, s=seed: stream_key(p, s, b"")) == "ValueError"
        cases.append(
            {
                "comment": why,
                "result": "invalid",
                "expected_reason": "ValueError",
                "op": "stream_key",
                "purpose": purpose,
                "seed": str(seed),
                "label": "",
            }
        )
    key = stream_key("vectors", 1, b"uniform_int")
    for bound in (1, 2, 3, 10, 1000, (1 << 32) + 1, (1 << 63) + 1, (1 << 64) - 1, 1 << 64):
        r = CountingReader(key)
        draws = [r.uniform_int(bound) for _ in range(16)]
        used = r.words_used
        cases.append(
            {
                "comment": f"16 draws below {bound}",
                "result": "valid",
                "op": "uniform_int",
                "key": key.hex(),
                "bound": str(bound),
                "draws": [str(d) for d in draws],
                "words_used": used,
            }
        )
    for bound in (0, (1 << 64) + 1):
        cases.append(
            {
                "comment": f"bound {bound} out of range",
                "result": "invalid",
                "expected_reason": "ValueError",
                "op": "uniform_int",
                "key": key.hex(),
                "bound": str(bound),
            }
        )
    for n in (0, 1, 2, 3, 5, 10, 52, 100):
        pk = stream_key("sampler", 1, hashing.u64(n))
        cases.append(
            {
                "comment": f"permutation of {n}",
                "result": "valid",
                "op": "permutation",
                "key": pk.hex(),
                "n": n,
                "permutation": permutation(pk, n).tolist(),
            }
        )
    pk = stream_key("sampler", 1, hashing.u64(10))
    wrong = permutation(pk, 10).tolist()
    wrong[0], wrong[1] = wrong[1], wrong[0]
    cases.append(
        {
            "comment": "permutation with two entries swapped",
            "result": "invalid",
            "expected_reason": "PERMUTATION_MISMATCH",
            "op": "permutation",
            "key": pk.hex(),
            "n": 10,
            "permutation": wrong,
        }
    )
    np_perm = np.random.default_rng(1).permutation(10).tolist()
    cases.append(
        {
            "comment": "numpy's generator is not the specified stream",
            "result": "invalid",
            "expected_reason": "PERMUTATION_MISMATCH",
            "op": "permutation",
            "key": pk.hex(),
            "n": 10,
            "permutation": np_perm,
        }
    )
    for n, s in ((10, 0), (10, 1), (10, 3), (10, 10), (1000, 8), (7, 7)):
        sk = stream_key("challenge", 0, hashing.u64(n) + hashing.u64(s))
        cases.append(
            {
                "comment": f"sample {s} of {n}",
                "result": "valid",
                "op": "sample",
                "key": sk.hex(),
                "n": n,
                "s": s,
                "sample": sample_without_replacement(sk, n, s),
            }
        )
    sk = stream_key("challenge", 0, hashing.u64(10) + hashing.u64(3))
    cases.append(
        {
            "comment": "sample sorted instead of in draw order",
            "result": "invalid",
            "expected_reason": "SAMPLE_MISMATCH",
            "op": "sample",
            "key": sk.hex(),
            "n": 10,
            "s": 3,
            "sample": sorted(sample_without_replacement(sk, 10, 3)),
        }
    )
    cases.append(
        {
            "comment": "sample larger than the population",
            "result": "invalid",
            "expected_reason": "ValueError",
            "op": "sample",
            "key": sk.hex(),
            "n": 3,
            "s": 4,
        }
    )
    fk = stream_key("init", 0, b"fc0.weight")
    floats = uniform_floats(fk, 8)
    cases.append(
        {
            "comment": "8 uniform floats",
            "result": "valid",
            "op": "uniform_floats",
            "key": fk.hex(),
            "n": 8,
            "floats": [struct.pack("<d", x).hex() for x in floats],
        }
    )
    return _number(cases)


# --- §11.4 signatures ---------------------------------------------------------------------------


def signature_cases() -> list[Case]:
    """Ed25519 signatures over the §11.4 digest under fixed seeds, and forged variants."""
    worker = SigningKey(bytes(range(32)))
    other = SigningKey(bytes([7]) * 32)
    job_id = hashing.tagged_hash(hashing.TAG_JOB, b"{}")
    root = hashing.tagged_hash(hashing.TAG_LEAF, b"transcript")
    pub = worker.verify_key.raw
    digest = signing_digest(job_id, root, pub)
    sig = worker.sign(digest)

    def case(
        why: str,
        result: str,
        *,
        seed: bytes = worker.seed_hex().encode(),
        key: bytes = pub,
        jid: bytes = job_id,
        troot: bytes = root,
        signature: bytes = sig,
        reason: str = "SIGNATURE_INVALID",
    ) -> Case:
        c: Case = {
            "comment": why,
            "result": result,
            "op": "digest",
            "seed": seed.decode(),
            "public_key": key.hex(),
            "job_id": jid.hex(),
            "transcript_root": troot.hex(),
            "digest": signing_digest(jid, troot, key).hex(),
            "signature": signature.hex(),
        }
        if result == "invalid":
            c["expected_reason"] = reason
        return c

    cases = [case("honest worker signature over the §11.4 digest", "valid")]
    o = other.verify_key.raw
    cases.append(
        case(
            "second fixed key",
            "valid",
            seed=other.seed_hex().encode(),
            key=o,
            signature=other.sign(signing_digest(job_id, root, o)),
        )
    )
    cases.append(case("verified under another public key", "invalid", key=o))
    flipped = bytearray(sig)
    flipped[10] ^= 0x40
    cases.append(case("one bit flipped in R", "invalid", signature=bytes(flipped)))
    flipped = bytearray(sig)
    flipped[40] ^= 0x01
    cases.append(case("one bit flipped in S", "invalid", signature=bytes(flipped)))
    cases.append(
        case(
            "signature over another transcript root",
            "invalid",
            troot=hashing.tagged_hash(hashing.TAG_LEAF, b"other"),
        )
    )
    cases.append(
        case(
            "signature over another job", "invalid", jid=hashing.tagged_hash(hashing.TAG_JOB, b"[]")
        )
    )
    cases.append(case("63-byte signature", "invalid", signature=sig[:63]))
    cases.append(case("65-byte signature", "invalid", signature=sig + b"\x00"))
    s_plus_l = (int.from_bytes(sig[32:], "little") + ED25519_L).to_bytes(32, "little")
    cases.append(
        case(
            "non-canonical S (S + L): malleability rejected",
            "invalid",
            signature=sig[:32] + s_plus_l,
        )
    )
    cases.append(case("all-zero signature", "invalid", signature=bytes(64)))
    seed, pk, msg, rsig = RFC8032_TEST1
    assert VerifyKey(bytes.fromhex(pk)).verify(bytes.fromhex(rsig), bytes.fromhex(msg))
    cases.append(
        {
            "comment": "RFC 8032 §7.1 TEST 1 (empty message)",
            "result": "valid",
            "op": "raw",
            "seed": seed,
            "public_key": pk,
            "message": msg,
            "signature": rsig,
        }
    )
    cases.append(
        {
            "comment": "RFC 8032 TEST 1 signature on a one-byte message",
            "result": "invalid",
            "expected_reason": "SIGNATURE_INVALID",
            "op": "raw",
            "seed": seed,
            "public_key": pk,
            "message": "00",
            "signature": rsig,
        }
    )
    return _number(cases)


FILES: dict[str, tuple[str, Callable[[], list[Case]]]] = {
    "hashing.json": ("tagged_hash", hashing_cases),
    "canonical_json.json": ("canonical_json", canonical_json_cases),
    "tensor_encoding.json": ("tensor_encoding", encoding_cases),
    "merkle_root.json": ("merkle_root", merkle_root_cases),
    "merkle_proof.json": ("merkle_proof", merkle_proof_cases),
    "stream.json": ("stream", stream_cases),
    "signature.json": ("signature", signature_cases),
}


def generate(root: Path) -> None:
    """Write every crypto vector file under ``root/crypto/``."""
    for name, (feature, build) in FILES.items():
        write_cases(root / "crypto" / name, feature, build())
