"""The checked-in vectors: re-checked by the library, cross-checked independently, golden bytes.

* every case of every area under ``vectors/`` passes ``dk.vectors.check_all``;
* every vector file of the foundation areas holds both valid and invalid cases;
* a second Merkle / tagged-hash implementation, written here from ``hashlib`` alone and
  structured differently (RFC 6962-style recursive split rather than level-by-level
  promotion), recomputes every Merkle root vector and judges every inclusion-proof vector;
* golden bytes: the canonical stream of one fixed tensor set, written out by hand, and the
  honest bundle's manifest are pinned to SHA-256 values (format v1);
* regenerating the vectors into a temporary directory reproduces the checked-in files.
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dk.vectors import AREAS, check_all

ROOT = Path(__file__).resolve().parents[2] / "vectors"
FOUNDATION = ("crypto", "pol", "bundle", "modes")

# Golden values of transcript format v1 (jobs version 2). Changing any of them is a format change.
GOLDEN_STREAM_SHA256 = "9b82b8e9f699ed9f664b2963ecde631c9585a6bfe33e8aed6d5ba99a153d6b9d"
GOLDEN_STREAM_ROOT = "f891b8507fe7c7620f90a9ec5c6e46ad12a80d533df4e969670822ef83ce7a3b"
GOLDEN_HONEST_MANIFEST_SHA256 = "35642852b9e783078721244a0b1f92e7b52900458959910c7406fb3cb67be305"


def _cases(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))["cases"]


# --- every case, every area --------------------------------------------------------------------


@pytest.fixture(scope="module")
def results() -> list[Any]:
    return check_all(ROOT)


def test_check_all_covers_the_foundation(results: list[Any]) -> None:
    assert {r.area for r in results} >= set(FOUNDATION)


@pytest.mark.parametrize("area", AREAS)
def test_every_vector_case_passes(area: str, results: list[Any]) -> None:
    assert (ROOT / area).is_dir(), f"no vectors for {area}"
    mine = [r for r in results if r.area == area]
    assert mine
    assert [(r.file, r.tc_id, r.message) for r in mine if not r.ok] == []


@pytest.mark.parametrize("area", FOUNDATION)
def test_each_vector_file_has_valid_and_invalid_cases(area: str) -> None:
    files = sorted((ROOT / area).glob("*.json"))
    assert files
    for path in files:
        kinds = {c["result"] for c in _cases(path)}
        assert kinds == {"valid", "invalid"}, path.name
        for c in _cases(path):
            assert c["result"] == "valid" or c.get("expected_reason"), (path.name, c["tcId"])
        ids = [c["tcId"] for c in _cases(path)]
        assert ids == list(range(1, len(ids) + 1)), path.name


def test_every_forgery_class_has_a_bundle_vector() -> None:
    from vectors.gen.forge import FORGERIES, STOLEN

    cases = _cases(ROOT / "bundle" / "cases.json")
    dirs = {c["dir"]: c for c in cases if c["result"] == "invalid"}
    for name, (_, reason) in FORGERIES.items():
        assert dirs[name]["expected_reason"] == reason
    assert STOLEN[0] in dirs
    assert any(c.get("pad_manifest_to") for c in cases)


# --- an independent Merkle and tagged-hash implementation ----------------------------------------


def _tagged(tag: str, data: bytes) -> bytes:
    raw = tag.encode("ascii")
    return hashlib.sha256(bytes([len(raw)]) + raw + data).digest()


def _leaf(data: bytes) -> bytes:
    return _tagged("dk/v1/merkle/leaf", data)


def _node(left: bytes, right: bytes) -> bytes:
    return _tagged("dk/v1/merkle/node", left + right)


def _split_root(hashes: list[bytes]) -> bytes:
    """Recursive root: left subtree over the largest power of two below ``len`` (RFC 6962).

    Promoting the odd last node level by level (SPEC §3.1) builds exactly this tree.
    """
    if not hashes:
        return _tagged("dk/v1/merkle/empty", b"")
    if len(hashes) == 1:
        return hashes[0]
    k = 1
    while 2 * k < len(hashes):
        k *= 2
    return _node(_split_root(hashes[:k]), _split_root(hashes[k:]))


def _walk(leaf: bytes, index: int, size: int, path: list[bytes], root: bytes) -> bool:
    """SPEC §3.2, transcribed from the text."""
    if index >= size or any(len(p) != 32 for p in path) or len(leaf) != 32:
        return False
    h, used = leaf, 0
    while size > 1:
        if index % 2 == 1 or index + 1 < size:
            if used == len(path):
                return False
            h = _node(path[used], h) if index % 2 == 1 else _node(h, path[used])
            used += 1
        index, size = index // 2, (size + 1) // 2
    return used == len(path) and h == root


def test_independent_merkle_roots() -> None:
    cases = _cases(ROOT / "crypto" / "merkle_root.json")
    sizes = set()
    for c in cases:
        root = _split_root([_leaf(bytes.fromhex(d)) for d in c["leaves"]]).hex()
        assert (root == c["root"]) == (c["result"] == "valid"), c["tcId"]
        sizes.add(len(c["leaves"]))
    assert sizes >= set(range(10))


def test_independent_merkle_proofs() -> None:
    cases = _cases(ROOT / "crypto" / "merkle_proof.json")
    for c in cases:
        ok = _walk(
            bytes.fromhex(c["leaf_hash"]),
            c["index"],
            c["size"],
            [bytes.fromhex(p) for p in c["path"]],
            bytes.fromhex(c["root"]),
        )
        assert ok == (c["result"] == "valid"), (c["tcId"], c["comment"])
    valid = [c for c in cases if c["result"] == "valid"]
    assert len(valid) == sum(range(1, 10))  # every leaf of every 1..9-leaf tree
    for c in valid:  # and each proof belongs to a tree the root vectors pin
        n = c["size"]
        leaves = [_leaf(bytes([i]) * (i + 1)) for i in range(n)]
        assert c["root"] == _split_root(leaves).hex()
        assert c["leaf_hash"] == leaves[c["index"]].hex()


def test_independent_tagged_hashes() -> None:
    for c in _cases(ROOT / "crypto" / "hashing.json"):
        if c.get("expected_reason") == "ValueError":  # tags outside 1..255 bytes
            continue
        digest = _tagged(c["tag"], bytes.fromhex(c["data"])).hex()
        assert (digest == c["digest"]) == (c["result"] == "valid"), c["tcId"]


# --- golden bytes --------------------------------------------------------------------------------


def _hand_stream() -> bytes:
    """The canonical stream of the golden set, spelled out field by field (SPEC §4.1)."""

    def tensor(name: bytes, code: int, shape: tuple[int, ...], data: bytes) -> bytes:
        return (
            struct.pack("<I", len(name))
            + name
            + bytes([code, len(shape)])
            + b"".join(struct.pack("<Q", d) for d in shape)
            + data
        )

    return (
        b"DKT1"
        + struct.pack("<Q", 3)
        + tensor(b"b", 4, (3,), bytes([1, 2, 255]))
        + tensor(b"step", 3, (), struct.pack("<q", 7))
        + tensor(b"w", 1, (2, 2), struct.pack("<4f", 1.5, -2.0, 0.25, 3.0))
    )


def test_golden_tensor_stream() -> None:
    from dk.crypto.encoding import encode_tensors, tensors_root

    tensors = {
        "w": np.array([[1.5, -2.0], [0.25, 3.0]], dtype=np.float32),
        "step": np.array(7, dtype=np.int64),
        "b": np.array([1, 2, 255], dtype=np.uint8),
    }
    stream = encode_tensors(tensors)
    assert stream == _hand_stream()
    assert hashlib.sha256(stream).hexdigest() == GOLDEN_STREAM_SHA256
    assert _leaf(stream).hex() == GOLDEN_STREAM_ROOT  # one chunk: the root is its leaf
    assert tensors_root(tensors).hex() == GOLDEN_STREAM_ROOT


def test_golden_honest_manifest() -> None:
    from dk.pol.transcript import parse_manifest, transcript_root

    data = (ROOT / "bundle" / "honest" / "manifest.json").read_bytes()
    assert hashlib.sha256(data).hexdigest() == GOLDEN_HONEST_MANIFEST_SHA256
    man = parse_manifest(data)
    assert man.to_bytes() == data  # canonical JSON
    assert transcript_root(man.raw) == man.transcript_root


def _fold(values: list[float]) -> float:
    """SPEC §1.4 from the text: add the last floor(n/2) terms onto the first, until one is left."""
    v, n = list(values), len(values)
    while n > 1:
        h = n // 2
        for i in range(h):
            v[i] += v[n - h + i]
        n -= h
    return v[0] if v else 0.0


def test_independent_update_norms_of_the_honest_bundle() -> None:
    """Every claimed update norm, recomputed from the blobs without dk (SPEC §1.4, §11.1)."""
    from safetensors.numpy import load_file

    bundle = ROOT / "bundle" / "honest"
    man = json.loads((bundle / "manifest.json").read_bytes())
    blobs = [load_file(bundle / ck["blob"]) for ck in man["checkpoints"]]
    for iv in man["intervals"]:
        a, b = blobs[iv["index"]], blobs[iv["index"] + 1]
        squares = [
            (y - x) * (y - x)
            for k in sorted(n for n in a if n.startswith("model/"))
            for x, y in zip(a[k].ravel().tolist(), b[k].ravel().tolist(), strict=True)
        ]
        assert math.sqrt(_fold(squares)).hex() == float(iv["update_norm"]).hex(), iv["index"]


# --- exact mode (SPEC II §4): exp32 / log32 / erf32 re-implemented from the SPEC text --------

_H = {  # the constants table of SPEC II §4, copied as hex
    "LOG2E": "0x1.715476p+0", "LN2_HI": "0x1.63p-1", "LN2_LO": "-0x1.bd0106p-13",
    "EXP_OVER": "0x1.633334p+6", "EXP_UNDER": "-0x1.ap+6", "SQRT2": "0x1.6a09e6p+0",
    "P": "0x1.a0d2cep-13 0x1.6e879cp-10 0x1.11121p-7 0x1.555382p-5 0x1.555554p-3 0x1p-1",
    "L": "0x1.555556p-1 0x1.99999ap-2 0x1.24924ap-2 0x1.c71c72p-3",
    "A": "0x1.20dd76p+0 -0x1.81274p-2 0x1.ce2d4p-4 -0x1.b7fd3cp-6 0x1.5422a6p-8 "
    "-0x1.a4b50ep-11 0x1.4b4662p-14",
    "B": "0x1.494dbp-2 -0x1.4f1986p-3 0x1.37ea2ap-4 -0x1.0dc644p-5 0x1.b65886p-7 "
    "-0x1.50b96ep-8 0x1.ee398ap-10 -0x1.71291p-11 0x1.e90a3ep-13",
    "C": "0x1.6e9828p-3 -0x1.bd6accp-5 0x1.043ff8p-6 -0x1.259b06p-8 0x1.409bdap-10 "
    "-0x1.51799p-12 0x1.5d4da4p-14 -0x1.926268p-16 0x1.7f99f4p-18",
}  # fmt: skip
_K = {k: [np.float32(float.fromhex(t)) for t in v.split()] for k, v in _H.items()}
_f32 = np.float32


def _pow2(j: int) -> np.float32:
    assert -75 <= j <= 64
    return _f32(2.0**j)  # exact in float32 (subnormal below -126)


def _exp32(x: np.float32) -> np.float32:
    (log2e,), (hi,), (lo,) = _K["LOG2E"], _K["LN2_HI"], _K["LN2_LO"]
    if x != x:
        return x
    if x > _K["EXP_OVER"][0]:
        return _f32(np.inf)
    if x < _K["EXP_UNDER"][0]:
        return _f32(0.0)
    n = math.floor(x * log2e + _f32(0.5))
    r = (x - _f32(n) * hi) - _f32(n) * lo
    z = r * r
    p0, p1, p2, p3, p4, p5 = _K["P"]
    p = ((((p0 * r + p1) * r + p2) * r + p3) * r + p4) * r + p5
    y = ((p * z) + r) + _f32(1.0)
    n1 = math.floor(n / 2)
    return (y * _pow2(n1)) * _pow2(n - n1)


def _log32(x: np.float32) -> np.float32:
    if x != x or x < 0:
        return _f32(np.nan)
    if x == 0:
        return _f32(-np.inf)
    if x == np.inf:
        return x
    m, e = x, 0
    for k in (64, 32, 16, 8, 4, 2, 1):
        if m >= _pow2(k):
            m, e = m * _pow2(-k), e + k
    if m < _pow2(-63):
        m, e = m * _pow2(64), e - 64
    for k in (64, 32, 16, 8, 4, 2, 1):
        if m < _pow2(1 - k):
            m, e = m * _pow2(k), e - k
    if m > _K["SQRT2"][0]:
        m, e = m * _f32(0.5), e + 1
    f = m - _f32(1.0)
    s = f / (_f32(2.0) + f)
    z = s * s
    l1, l2, l3, l4 = _K["L"]
    tail = s * (z * (((l4 * z + l3) * z + l2) * z + l1))
    lg = (_f32(2.0) * s) + tail
    fe = _f32(e)
    return (fe * _K["LN2_HI"][0]) + ((fe * _K["LN2_LO"][0]) + lg)


def _erf32(x: np.float32) -> np.float32:
    if x != x:
        return x
    a = abs(x)
    if a < 1:
        s, q = a * a, _K["A"][6]
        for c in reversed(_K["A"][1:6]):
            q = q * s + c
        r = a * (q * s + _K["A"][0])
    elif a < 4:
        coef, t = (_K["B"], a - _f32(1.5)) if a < 2 else (_K["C"], a - _f32(3.0))
        q = coef[8]
        for c in reversed(coef[:8]):
            q = q * t + c
        r = _f32(1.0) - _exp32(-(a * a)) * q
    else:
        r = _f32(1.0)
    return -r if x < 0 else r


def test_independent_exact_elementwise_functions() -> None:
    """SPEC II §4 is enough to re-implement exp32/log32/erf32 bit for bit (every vector)."""
    fns = {"exp32": _exp32, "log32": _log32, "erf32": _erf32}
    checked = 0
    with np.errstate(over="ignore", under="ignore"):
        for c in _cases(ROOT / "exact" / "elementwise.json"):
            xs = np.frombuffer(bytes.fromhex(c["x"]), dtype="<f4")
            got = np.array([fns[c["function"]](x) for x in xs], dtype="<f4").tobytes()
            assert (got.hex() == c["y"]) == (c["result"] == "valid"), c["tcId"]
            checked += len(xs)
    assert checked > 300


# --- reproducible generation ----------------------------------------------------------------------


def _same_tree(a: Path, b: Path) -> list[str]:
    files_a = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    if files_a != files_b:
        return [f"file lists differ: {sorted(set(files_a) ^ set(files_b))[:5]}"]
    return [f for f in files_a if not filecmp.cmp(a / f, b / f, shallow=False)]


@pytest.mark.parametrize("area", ["crypto", "pol"])
def test_regeneration_is_byte_identical(area: str, tmp_path: Path) -> None:
    import importlib

    importlib.import_module(f"vectors.gen.{area}").generate(tmp_path)
    assert _same_tree(ROOT / area, tmp_path / area) == []


@pytest.mark.slow
def test_modes_regeneration_is_byte_identical(tmp_path: Path) -> None:
    """Everything but the tolerant bundles, which PyTorch trains (unspecified float32 bits;
    their file lists differ too, since blob names are hashes).

    The zk bundles hold random proofs; like the generator, the test keeps the checked-in ones
    (and the SRS they were proven with)."""
    import shutil

    from vectors.gen import modes

    (tmp_path / "modes").mkdir()
    for name in modes.ZK_KEEP:
        src = ROOT / "modes" / name
        if src.is_dir():
            shutil.copytree(src, tmp_path / "modes" / name)
        elif src.exists():
            shutil.copy(src, tmp_path / "modes" / name)
    (tmp_path / modes.SRS).parent.mkdir(parents=True)
    shutil.copy(ROOT / modes.SRS, tmp_path / modes.SRS)
    modes.generate(tmp_path)
    no_tolerant = shutil.ignore_patterns("tolerant-*")  # compare all but the tolerant bundles
    shutil.copytree(ROOT / "modes", tmp_path / "checked-in", ignore=no_tolerant)
    shutil.copytree(tmp_path / "modes", tmp_path / "regenerated", ignore=no_tolerant)
    assert _same_tree(tmp_path / "checked-in", tmp_path / "regenerated") == []


@pytest.mark.slow
def test_bundle_regeneration_is_byte_identical(tmp_path: Path) -> None:
    from vectors.gen import bundle

    bundle.generate(tmp_path)
    assert _same_tree(ROOT / "bundle", tmp_path / "bundle") == []


# --- circuits (SPEC Part IV): an independent quantiser and digest -----------------------------

_BN254_P = 21888242871839275222246405745257275088548364400416034343698204186575808495617


def _felt_bytes(value: float, scale: int) -> bytes:
    """SPEC IV §3.1-§3.2 from the text: Python's round() is half-to-even on exact floats."""
    q = round(value * 2**scale)
    assert abs(q) < 2**24
    return (q % _BN254_P).to_bytes(32, "little")


def test_independent_circuit_quantisation() -> None:
    for c in _cases(ROOT / "circuits" / "quantize.json"):
        values = struct.unpack(f"<{len(c['input']) // 8}f", bytes.fromhex(c["input"]))
        if c["result"] == "valid":
            assert [round(v * 2 ** c["scale"]) for v in values] == c["q"], c["tcId"]


def test_independent_circuit_digests() -> None:
    checked = 0
    for c in _cases(ROOT / "circuits" / "digest.json"):
        if c.get("op") != "tensor_set" or c["kind"] != "sha256" or c["result"] != "valid":
            continue
        per_tensor = {}
        for name, t in sorted(c["tensors"].items()):
            data = bytes.fromhex(t["data"])
            values = struct.unpack(f"<{len(data) // 4}f", data)
            body = struct.pack("<Q", len(values)) + b"".join(
                _felt_bytes(v, c["scale"]) for v in values
            )
            per_tensor[name] = _tagged("dk/v1/circuits/tensor", body)
        assert {k: d.hex() for k, d in per_tensor.items()} == c["tensor_digests"], c["tcId"]
        body = struct.pack("<Q", len(per_tensor)) + b"".join(per_tensor.values())
        assert _tagged("dk/v1/circuits/tensor-set", body).hex() == c["digest"], c["tcId"]
        checked += 1
    assert checked >= 5


def test_circuit_vector_files_have_valid_and_invalid_cases() -> None:
    for path in sorted((ROOT / "circuits").glob("*.json")):
        cases = _cases(path)
        assert {c["result"] for c in cases} == {"valid", "invalid"}, path.name
        assert [c["tcId"] for c in cases] == list(range(1, len(cases) + 1)), path.name
        for c in cases:
            assert c["result"] == "valid" or c.get("expected_reason"), (path.name, c["tcId"])


@pytest.mark.ezkl
def test_circuit_regeneration_keeps_the_checked_in_proofs(tmp_path: Path) -> None:
    # The SRS and the proofs are random; the generator reuses the checked-in ones, so a rerun
    # over a copy reproduces every file byte for byte.
    import shutil

    pytest.importorskip("ezkl")
    from vectors.gen import circuits

    shutil.copytree(ROOT / "circuits", tmp_path / "circuits")
    circuits.generate(tmp_path)
    assert _same_tree(ROOT / "circuits", tmp_path / "circuits") == []


def test_missing_and_unknown_vector_files_fail(tmp_path: Path) -> None:
    """A checker never passes silently: a missing file and a stray file each fail a case."""
    import shutil

    from dk.vectors import compress

    shutil.copytree(ROOT / "compress", tmp_path / "compress")
    (tmp_path / "compress" / "stray.json").write_text('{"cases": []}')
    victim = sorted((tmp_path / "compress").glob("*.json"))[0]
    if victim.name == "stray.json":
        victim = sorted((tmp_path / "compress").glob("*.json"))[1]
    victim.unlink()
    bad = {(r.file, r.message) for r in compress.check(tmp_path) if not r.ok}
    assert bad == {(victim.name, "file missing"), ("stray.json", "no checker for this file")}
