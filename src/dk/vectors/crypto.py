"""Re-check the crypto vectors (``vectors/crypto/*.json``) with the installed library.

One checker per file re-derives each case: tagged hashes (SPEC §2), canonical JSON (§1.3),
tensor streams and roots (§4), Merkle roots and inclusion proofs (§3), the specified streams
(§5) and Ed25519 signatures over the §11.4 digest. A ``valid`` case must reproduce every stored
value; an ``invalid`` case must be rejected the way ``expected_reason`` says: an exception class
name (``FormatError``, ``ValueError``) means the operation must raise it, any other code means
the stored value must *not* be what the library computes or accepts.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dk.crypto.canonical_json import canonical_json, parse_json
from dk.crypto.encoding import CHUNK_SIZE, decode_tensors, encode_tensors, tensors_root
from dk.crypto.hashing import tagged_hash
from dk.crypto.keys import SigningKey, VerifyKey
from dk.crypto.merkle import InclusionProof, leaf_hash, merkle_root, verify_inclusion
from dk.crypto.stream import (
    WordReader,
    keystream,
    permutation,
    sample_without_replacement,
    stream_key,
    stream_words,
    uniform_floats,
)
from dk.pol.transcript import signing_digest
from dk.vectors import CaseResult, run_cases

Case = dict[str, Any]

# Ed25519 group order (RFC 8032 §5.1).
ED25519_L = 2**252 + 27742317777372353535851937790883648493

# RFC 8032 §7.1 TEST 1: (secret seed, public key, message, signature), hex.
RFC8032_TEST1 = (
    "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
    "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
    "",
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065"
    "224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
)

# RFC 8439 Appendix A.1, test vectors #1 and #2: ChaCha20 blocks of the all-zero key and nonce
# at block counters 0 and 1.
RFC8439_ZERO_KEY_BLOCKS = (
    "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
    "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586",
    "9f07e7be5551387a98ba977c732d080dcb0f29a048e3656912c6533e32ee7aed"
    "29b721769ce64e43d57133b074d839d531ed1f28510afb45ace10a1f4b794d6f",
)

_SPECIALS = (
    math.nan,
    math.inf,
    -0.0,
    2.0**-149,
    -math.inf,
    1.5,
)  # 2^-149: float32's least subnormal


class CountingReader(WordReader):
    """A :class:`WordReader` that counts the words it hands out (for rejection sampling)."""

    def __init__(self, key: bytes) -> None:
        super().__init__(key)
        self.words_used = 0

    def next_word(self) -> int:
        """The next word, counted."""
        self.words_used += 1
        return super().next_word()


def build_tensor_set(spec: dict[str, dict[str, Any]]) -> dict[str, np.ndarray]:
    """Materialise a tensor-set recipe ``{name: {dtype, shape, fill}}``.

    ``fill`` is ``arange`` (``0, 1, …`` cast to the dtype, wrapping for ``uint8``),
    ``arange_neg`` (``arange - size // 2``) or ``specials`` (NaN, +inf, -0.0, 2^-149 (the
    least float32 subnormal), -inf, 1.5, repeated; for float dtypes).
    """
    out: dict[str, np.ndarray] = {}
    for name, t in spec.items():
        shape = tuple(int(d) for d in t["shape"])
        size = math.prod(shape)
        if t["fill"] == "arange":
            base = np.arange(size, dtype=np.int64)
        elif t["fill"] == "arange_neg":
            base = np.arange(size, dtype=np.int64) - size // 2
        elif t["fill"] == "specials":
            base = np.array([_SPECIALS[i % len(_SPECIALS)] for i in range(size)], dtype=np.float64)
        else:
            raise ValueError(f"unknown fill {t['fill']!r}")
        with np.errstate(over="ignore", under="ignore"):
            out[name] = base.astype(np.dtype(t["dtype"])).reshape(shape)
    return out


def _raises(fn: Callable[[], object], expected: str) -> str:
    try:
        fn()
    except Exception as e:
        name = type(e).__name__
        return "" if name == expected else f"raised {name}: {e}, expected {expected}"
    return f"did not raise, expected {expected}"


def _expect(cond: bool, what: str) -> str:
    return "" if cond else what


_ERRORS = ("FormatError", "ValueError")


def _check_hashing(c: Case) -> str:
    if c.get("expected_reason") in _ERRORS:
        return _raises(
            lambda: tagged_hash(c["tag"], bytes.fromhex(c["data"])), c["expected_reason"]
        )
    got = tagged_hash(c["tag"], bytes.fromhex(c["data"])).hex()
    return _expect((got == c["digest"]) == (c["result"] == "valid"), f"digest {got}")


def _check_canonical(c: Case) -> str:
    if c.get("op") == "number":  # a binary64 value (big-endian hex) and its RFC 8785 text
        value = struct.unpack(">d", bytes.fromhex(c["f64"]))[0]
        if c["result"] == "invalid":
            return _raises(lambda: canonical_json(value), c["expected_reason"])
        text = canonical_json(value)
        if text.hex() != c["canonical"]:
            return f"canonical form {text!r}"
        back = float(parse_json(text, limit=64))
        return _expect(back == value, "the canonical text does not parse back to the value")
    data = bytes.fromhex(c["input"])
    if c["result"] == "invalid":
        return _raises(lambda: parse_json(data, limit=c["limit"]), c["expected_reason"])
    got = canonical_json(parse_json(data, limit=1 << 20))
    if got.hex() != c["canonical"]:
        return f"canonical form {got!r}"
    again = canonical_json(parse_json(got, limit=1 << 20))
    return _expect(again == got, "canonical form is not a fixed point")


def _check_encoding(c: Case) -> str:
    if c.get("op") == "decode":
        return _raises(lambda: decode_tensors(bytes.fromhex(c["stream"])), c["expected_reason"])
    if c.get("op") == "encode":
        return _raises(lambda: encode_tensors(build_tensor_set(c["tensors"])), c["expected_reason"])
    tensors = build_tensor_set(c["tensors"])
    root = tensors_root(tensors).hex()
    if c["result"] == "invalid":
        return _expect(root != c["root"], "invalid root matches")
    stream = encode_tensors(tensors)
    checks = [
        (len(stream) == c["stream_len"], f"stream length {len(stream)}"),
        (-(-len(stream) // CHUNK_SIZE) == c["chunks"], "chunk count"),
        (root == c["root"], f"root {root}"),
        ("stream" not in c or stream.hex() == c["stream"], "stream bytes differ"),
        ("stream_prefix" not in c or stream[:64].hex() == c["stream_prefix"], "stream prefix"),
        (
            "stream_sha256" not in c or hashlib.sha256(stream).hexdigest() == c["stream_sha256"],
            "stream SHA-256",
        ),
    ]
    for ok, what in checks:
        if not ok:
            return what
    back = decode_tensors(stream)
    same = list(back) == sorted(tensors, key=lambda n: n.encode()) and all(
        back[k].tobytes() == np.ascontiguousarray(v).astype(v.dtype.newbyteorder("<")).tobytes()
        and back[k].shape == v.shape
        and back[k].dtype.name == v.dtype.name
        for k, v in tensors.items()
    )
    return _expect(same, "decode(encode(set)) differs from the set")


def _check_merkle_root(c: Case) -> str:
    root = merkle_root([leaf_hash(bytes.fromhex(d)) for d in c["leaves"]]).hex()
    return _expect((root == c["root"]) == (c["result"] == "valid"), f"root {root}")


def _check_merkle_proof(c: Case) -> str:
    leaf, root = bytes.fromhex(c["leaf_hash"]), bytes.fromhex(c["root"])
    proof = InclusionProof(c["index"], c["size"], tuple(bytes.fromhex(p) for p in c["path"]))
    ok = verify_inclusion(leaf, proof, root)
    if ok != (c["result"] == "valid"):
        return f"verify_inclusion returned {ok}"
    return ""


def _check_stream(c: Case) -> str:
    op = c["op"]
    invalid = c["result"] == "invalid"
    if op == "chacha20":
        got = keystream(bytes.fromhex(c["key"]), len(c["keystream"]) // 2).hex()
        return _expect(got == c["keystream"], "keystream differs")
    if op == "stream_key":
        label = bytes.fromhex(c["label"])
        if invalid:
            return _raises(
                lambda: stream_key(c["purpose"], int(c["seed"]), label), c["expected_reason"]
            )
        key = stream_key(c["purpose"], int(c["seed"]), label)
        words = [str(int(w)) for w in stream_words(key, len(c["words"]))]
        return _expect(key.hex() == c["key"] and words == c["words"], "key or words differ")
    key = bytes.fromhex(c["key"])
    if op == "uniform_int":
        bound = int(c["bound"])
        r = CountingReader(key)
        if invalid:
            return _raises(lambda: r.uniform_int(bound), c["expected_reason"])
        drawn = [str(r.uniform_int(bound)) for _ in c["draws"]]
        return _expect(drawn == c["draws"] and r.words_used == c["words_used"], f"draws {drawn}")
    if op == "permutation":
        perm = permutation(key, c["n"]).tolist()
        return _expect((perm == c["permutation"]) != invalid, f"permutation {perm}")
    if op == "sample":
        if c.get("expected_reason") in _ERRORS:
            return _raises(
                lambda: sample_without_replacement(key, c["n"], c["s"]), c["expected_reason"]
            )
        sample = sample_without_replacement(key, c["n"], c["s"])
        return _expect((sample == c["sample"]) != invalid, f"sample {sample}")
    if op == "uniform_floats":
        floats = [struct.pack("<d", x).hex() for x in uniform_floats(key, c["n"])]
        return _expect(floats == c["floats"], "floats differ")
    return f"unknown op {op!r}"


def _check_signature(c: Case) -> str:
    sk = SigningKey(bytes.fromhex(c["seed"]))
    pub = bytes.fromhex(c["public_key"])
    sig = bytes.fromhex(c["signature"])
    if c["op"] == "raw":
        msg = bytes.fromhex(c["message"])
    else:
        msg = signing_digest(bytes.fromhex(c["job_id"]), bytes.fromhex(c["transcript_root"]), pub)
        if msg.hex() != c["digest"]:
            return f"digest {msg.hex()}"
    ok = VerifyKey(pub).verify(sig, msg)
    if c["result"] == "valid":
        if sk.verify_key.raw != pub or sk.sign(msg) != sig:
            return "public key or deterministic signature differs"
        return _expect(ok, "signature does not verify")
    return _expect(not ok, "invalid signature verifies")


CHECKERS: dict[str, Callable[[Case], str]] = {
    "hashing.json": _check_hashing,
    "canonical_json.json": _check_canonical,
    "tensor_encoding.json": _check_encoding,
    "merkle_root.json": _check_merkle_root,
    "merkle_proof.json": _check_merkle_proof,
    "stream.json": _check_stream,
    "signature.json": _check_signature,
}


def check(root: Path) -> list[CaseResult]:
    """Re-derive every case of ``root/crypto/*.json``; missing and unknown files are failures."""
    return run_cases(root, "crypto", CHECKERS)
