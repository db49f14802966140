"""Generate ``vectors/circuits/``: quantisation, field elements, digests and proof records.

SPEC Part IV. ``quantize.json``, ``felt.json`` and ``digest.json`` are computed from fixed
values and seeds (the Poseidon cases call EZKL's ``poseidon_hash``, which is deterministic);
``proofs.json`` and its SRS come from :mod:`vectors.gen.circuit_proofs`. Run with
``python -m vectors.gen circuits``; checked by :mod:`dk.vectors.circuits`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dk.circuits.quantize import P, int_to_felt
from dk.vectors import write_cases
from dk.vectors.circuits import (
    batch_case_digest,
    set_digests,
    tensors_to_json,
)
from vectors.gen import circuit_proofs

S = 12
U = 2.0**-S  # one unit in the last place at scale 12


def _f32(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def _quant(comment: str, scale: int, values: Any, q: list[int] | None) -> dict[str, Any]:
    arr = _f32(values)
    case: dict[str, Any] = {
        "comment": comment,
        "scale": scale,
        "shape": list(arr.shape),
        "input": arr.astype("<f4").tobytes().hex(),
    }
    if q is None:
        return {**case, "result": "invalid", "expected_reason": "FormatError"}
    deq = np.ldexp(np.asarray(q, dtype=np.float64), -scale).astype("<f4")
    return {**case, "result": "valid", "q": q, "dequantized": deq.tobytes().hex()}


def quantize_cases() -> list[dict[str, Any]]:
    """SPEC IV §3.1: round half to even at ``2**s``, ``|q| < 2**24``, finite values only."""
    half = float(_f32(0.5 * U))
    top = (2**24 - 1) * U
    grid = np.random.default_rng(7).integers(-(2**20), 2**20, size=(2, 3))
    cases = [
        _quant("zero and negative zero", S, [0.0, -0.0], [0, 0]),
        _quant(
            "integers and binary fractions",
            S,
            [1.0, -1.0, 0.5, 0.25, -2.75],
            [4096, -4096, 2048, 1024, -11264],
        ),
        _quant("grid points", S, [U, -U, 3 * U, 4095 * U], [1, -1, 3, 4095]),
        _quant("half an ulp rounds to even (0)", S, [half, -half], [0, 0]),
        _quant(
            "1.5, 2.5, 3.5, -1.5, -2.5 ulps round to even",
            S,
            [1.5 * U, 2.5 * U, 3.5 * U, -1.5 * U, -2.5 * U],
            [2, 2, 4, -2, -2],
        ),
        _quant("just above half an ulp rounds up", S, [np.nextafter(_f32(half), 1)], [1]),
        _quant("just below half an ulp rounds down", S, [np.nextafter(_f32(half), 0)], [0]),
        _quant("smallest subnormal float32", S, [np.float32(1e-45)], [0]),
        _quant("largest magnitudes in range", S, [top, -top], [2**24 - 1, -(2**24 - 1)]),
        _quant("a 2x3 tensor, row-major", S, grid * U, grid.ravel().tolist()),
        _quant("scale 0: half to even", 0, [2.5, 3.5, -2.5, 16777215.0], [2, 4, -2, 16777215]),
        _quant("scale 30", 30, [2.0**-30, 1.5 * 2.0**-30, 2.0**-7], [1, 2, 2**23]),
        _quant("scale 20", 20, [0.1], [104858]),
        _quant("2**12 at scale 12 reaches 2**24", S, [4096.0], None),
        _quant("-2**12 at scale 12", S, [-4096.0], None),
        _quant("one element out of range", S, [1.0, 5000.0, 2.0], None),
        _quant("largest float32", S, [np.finfo(np.float32).max], None),
        _quant("NaN", S, [float("nan")], None),
        _quant("+inf", S, [float("inf")], None),
        _quant("-inf among finite values", S, [1.0, float("-inf")], None),
        _quant("2**24 at scale 0", 0, [16777216.0], None),
        _quant("scale 31", 31, [1.0], None),
        _quant("scale -1", -1, [1.0], None),
    ]
    return cases


def felt_cases() -> list[dict[str, Any]]:
    """SPEC IV §3.2: ``q mod P`` as 32 little-endian bytes; decoding with ``(P-1)/2`` split."""
    half = (P - 1) // 2
    cases: list[dict[str, Any]] = []
    for v in (0, 1, -1, 4096, -4096, 2**24 - 1, -(2**24 - 1), half, -half):
        cases.append(
            {"op": "encode", "comment": f"encode {v}", "int": str(v), "felt": int_to_felt(v)}
        )
    for raw, v, what in (
        (P - 1, -1, "P - 1 is -1"),
        (half, half, "(P - 1) / 2 is the largest positive value"),
        (half + 1, -half, "(P + 1) / 2 is the most negative value"),
        (2**248, 2**248, "2**248 (top byte only)"),
    ):
        felt = raw.to_bytes(32, "little").hex()
        cases.append({"op": "decode", "comment": what, "felt": felt, "int": str(v)})
    cases = [{**c, "result": "valid"} for c in cases]
    bad: list[tuple[str, Any]] = [
        ("P is not reduced", P.to_bytes(32, "little").hex()),
        ("P + 1 is not reduced", (P + 1).to_bytes(32, "little").hex()),
        ("2**256 - 1", "ff" * 32),
        ("63 hex characters", "0" * 63),
        ("65 hex characters", "0" * 65),
        ("31 bytes", "00" * 31),
        ("33 bytes", "00" * 33),
        ("0x prefix", "0x" + "00" * 31),
        ("non-hex character", "g" + "0" * 63),
        ("empty string", ""),
        ("a JSON number", 12),
    ]
    for what, felt in bad:
        cases.append(
            {
                "op": "decode",
                "comment": what,
                "felt": felt,
                "result": "invalid",
                "expected_reason": "FormatError",
            }
        )
    cases.append(
        {
            "op": "encode",
            "comment": "big-endian bytes of 1 (a wrong encoding)",
            "int": "1",
            "felt": (1).to_bytes(32, "big").hex(),
            "result": "invalid",
            "expected_reason": "ENCODING_MISMATCH",
        }
    )
    cases.append(
        {
            "op": "encode",
            "comment": "-1 as two's complement 2**256 - 1 (a wrong encoding)",
            "int": "-1",
            "felt": "ff" * 32,
            "result": "invalid",
            "expected_reason": "ENCODING_MISMATCH",
        }
    )
    ints = [1, -1, 2**24 - 1, -(2**24 - 1)]
    arrays: list[tuple[str, list[int], list[int], bool]] = [
        ("2x2 array at the range limits", ints, [2, 2], True),
        ("2**24 is outside the quantisation range", [0, 2**24], [2], False),
        ("-2**24 is outside the quantisation range", [-(2**24), 0], [2], False),
        ("three elements for shape (2, 2)", [1, 2, 3], [2, 2], False),
    ]
    for what, vals, shape, ok in arrays:
        c: dict[str, Any] = {
            "op": "decode_array",
            "comment": what,
            "felts": [int_to_felt(v) for v in vals],
            "shape": shape,
            "result": "valid" if ok else "invalid",
        }
        cases.append({**c, "ints": vals} if ok else {**c, "expected_reason": "FormatError"})
    cases.append(
        {
            "op": "decode_array",
            "comment": "an element not reduced modulo P",
            "felts": [int_to_felt(1), P.to_bytes(32, "little").hex()],
            "shape": [2],
            "result": "invalid",
            "expected_reason": "FormatError",
        }
    )
    return cases


def _tiny_params(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "fc0.bias": (rng.normal(size=2) * 0.4).astype(np.float32),
        "fc0.weight": (rng.normal(size=(2, 4)) * 0.4).astype(np.float32),
    }


def _set_case(comment: str, tensors: dict[str, Any], scale: int, kind: str) -> dict[str, Any]:
    arrays = {k: _f32(v) for k, v in tensors.items()}
    case: dict[str, Any] = {
        "op": "tensor_set",
        "comment": comment,
        "kind": kind,
        "scale": scale,
        "tensors": tensors_to_json(arrays),
    }
    try:
        per_tensor, digest = set_digests(arrays, scale, kind)
    except ValueError:
        return {**case, "result": "invalid", "expected_reason": "FormatError"}
    if kind == "poseidon":
        case["requires"] = "ezkl"
    return {**case, "result": "valid", "tensor_digests": per_tensor, "digest": digest}


def _wrong_digests(params: dict[str, np.ndarray]) -> list[tuple[str, str]]:
    """What wrong implementations compute for the set digest of ``params`` at scale 12."""
    import hashlib

    from dk.circuits.quantize import TAG_TENSOR, TAG_TENSOR_SET, quantize
    from dk.crypto.hashing import tagged_hash, u64

    def felts(a: np.ndarray, order: str = "little", scale: int = S) -> bytes:
        return b"".join((int(v) % P).to_bytes(32, order) for v in quantize(a, scale).ravel())

    def tensor(data: bytes, n: int, tag: str = TAG_TENSOR) -> bytes:
        return tagged_hash(tag, u64(n), data)

    names = sorted(params)
    sizes = {k: params[k].size for k in names}
    good = [tensor(felts(params[k]), sizes[k]) for k in names]

    def combine(ds: list[bytes], tag: str = TAG_TENSOR_SET, count: bool = True) -> str:
        return tagged_hash(tag, *([u64(len(ds))] if count else []), b"".join(ds)).hex()

    return [
        ("set digest in reverse name order", combine(good[::-1])),
        (
            "tensor digests without the tag (plain SHA-256)",
            combine([hashlib.sha256(u64(sizes[k]) + felts(params[k])).digest() for k in names]),
        ),
        (
            "big-endian field elements",
            combine([tensor(felts(params[k], "big"), sizes[k]) for k in names]),
        ),
        (
            "no element count in the tensor digests",
            combine([tagged_hash(TAG_TENSOR, felts(params[k])) for k in names]),
        ),
        ("no tensor count in the set digest", combine(good, count=False)),
        ("set digest under the tensor tag", combine(good, tag=TAG_TENSOR)),
        (
            "quantised at scale 8 instead of 12",
            combine([tensor(felts(params[k], scale=8), sizes[k]) for k in names]),
        ),
        (
            "float32 bytes instead of field elements",
            combine([tensor(params[k].astype("<f4").tobytes(), sizes[k]) for k in names]),
        ),
    ]


def _batch_case(comment: str, loss: str, x: Any, y: Any, out: int) -> dict[str, Any]:
    x = _f32(x)
    y = np.asarray(y)
    case: dict[str, Any] = {
        "op": "batch",
        "comment": comment,
        "model": {"arch": "linear", "input_dim": x.shape[1], "output_dim": out},
        "loss": loss,
        "batch_size": 2,
        "scale": S,
        "x": tensors_to_json({"x": x})["x"],
        "y": y.tolist() if y.dtype.kind == "i" else tensors_to_json({"y": _f32(y)})["y"],
    }
    try:
        return {**case, "result": "valid", "digest": batch_case_digest(case)}
    except ValueError:
        return {**case, "result": "invalid", "expected_reason": "FormatError"}


def digest_cases(poseidon: bool) -> list[dict[str, Any]]:
    """SPEC IV §3.3: tensor and set digests (sha256; poseidon when EZKL is importable)."""
    params = _tiny_params(3)
    rng = np.random.default_rng(5)
    x = rng.uniform(0, 1, size=(2, 3)).astype(np.float32)
    onehot = np.array([[1, 0, 0, 0], [0, 0, 0, 1]], dtype=np.float32)
    cases = [
        _set_case("one tensor of three values", {"w": [0.5, -0.25, 1.0]}, S, "sha256"),
        _set_case("linear 4->2 parameters", params, S, "sha256"),
        _set_case("the same parameters at scale 8", params, 8, "sha256"),
        _set_case(
            "names in code-point order (B < a < a.b < b)",
            {"b": [1.0], "a": [2.0], "a.b": [3.0], "B": [4.0]},
            S,
            "sha256",
        ),
        _set_case("a 0-d tensor", {"s": np.float32(3.0)}, S, "sha256"),
        _set_case(
            "a rank-3 tensor, row-major", {"t": np.arange(8).reshape(2, 2, 2) / 8}, S, "sha256"
        ),
        _set_case(
            "batch {x, y} with y one-hot (equals the labelled batch case below)",
            {"x": x, "y": onehot},
            S,
            "sha256",
        ),
        _set_case("empty tensor set", {}, S, "sha256"),
        _set_case("a tensor with no elements", {"w": np.zeros((0,))}, S, "sha256"),
        _set_case("a NaN value", {"w": [1.0, float("nan")]}, S, "sha256"),
        _set_case("a value outside the range at scale 12", {"w": [5000.0]}, S, "sha256"),
        _batch_case("labels one-hot encoded (cross_entropy)", "cross_entropy", x, [0, 3], 4),
        _batch_case("labels one-hot encoded (mse)", "mse", x, [0, 3], 4),
        _batch_case("float targets (mse)", "mse", x, [[0.5, -1.0], [0.25, 2.0]], 2),
        _batch_case("label 4 with 4 outputs", "cross_entropy", x, [0, 4], 4),
        _batch_case("float targets with cross_entropy", "cross_entropy", x, onehot, 4),
        _batch_case("targets of the wrong width", "mse", x, [[0.5], [1.0]], 2),
    ]
    for what, digest in _wrong_digests(params):
        case = _set_case(what, params, S, "sha256")
        case.pop("tensor_digests")
        cases.append(
            {**case, "result": "invalid", "expected_reason": "DIGEST_MISMATCH", "digest": digest}
        )
    if poseidon:
        cases += [
            _set_case(
                "Poseidon: one tensor of three values", {"w": [0.5, -0.25, 1.0]}, S, "poseidon"
            ),
            _set_case("Poseidon: linear 4->2 parameters", params, S, "poseidon"),
        ]
    return cases


def _have_ezkl() -> bool:
    try:
        import ezkl  # noqa: F401
    except ImportError:
        return False
    return True


def _numbered(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"tcId": i, **c} for i, c in enumerate(cases, 1)]


def generate(root: Path) -> None:
    """Write ``root/circuits/`` (every case is checked with the library before it is kept).

    Raises:
        RuntimeError: when the library disagrees with a case (a generator or library bug).
    """
    from dk.vectors.circuits import check

    out = Path(root) / "circuits"
    write_cases(out / "quantize.json", "circuits/quantize", _numbered(quantize_cases()))
    write_cases(out / "felt.json", "circuits/felt", _numbered(felt_cases()), modulus=str(P))
    write_cases(out / "digest.json", "circuits/digest", _numbered(digest_cases(_have_ezkl())))
    circuit_proofs.generate(out)
    failed = [r for r in check(Path(root)) if not r.ok]
    if failed:
        raise RuntimeError(f"the library disagrees with generated circuit vectors: {failed[:3]}")
