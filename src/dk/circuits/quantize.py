"""Canonical quantisation of float32 tensors to BN254 field elements, and their digests.

SPEC IV §3. A float32 value ``v`` at scale ``s`` becomes the integer
``q = round_half_even(v * 2**s)`` (exact: ``v * 2**s`` is computed in float64, which holds
every float32 times a power of two without rounding), which must satisfy
``|q| < 2**QMAX_BITS``; ``q`` is embedded in the BN254 scalar field as ``q mod P`` (two's
complement: negative values become ``P - |q|``) and written as 32 little-endian bytes, hex,
the encoding EZKL uses. The Poseidon digest of a tensor is EZKL's Poseidon hash of its
elements in row-major order; a named tensor set is digested tensor by tensor in sorted-name
order (EZKL's Poseidon for hashed visibility, tagged SHA-256 of the same bytes for public
visibility, where the binding is checked outside the circuit). Decoding is exact big-integer
arithmetic: an element above ``(P - 1) / 2`` is
negative.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from dk.crypto.hashing import tagged_hash, u64
from dk.errors import BackendUnavailable, FormatError

#: The BN254 scalar field modulus (the field EZKL's circuits live in).
P = 21888242871839275222246405745257275088548364400416034343698204186575808495617
#: Quantised magnitudes must stay below 2**QMAX_BITS (so q * 2**-s is exact in float32).
QMAX_BITS = 24
FELT_HEX_LEN = 64
MAX_ELEMENTS = 1 << 22
TAG_TENSOR = "dk/v1/circuits/tensor"
TAG_TENSOR_SET = "dk/v1/circuits/tensor-set"


def quantize(values: np.ndarray, scale: int) -> np.ndarray:
    """Quantise floats to integers ``round_half_even(v * 2**scale)``.

    Args:
        values: any float array (float32 in practice).
        scale: the fixed-point scale ``s`` (bits after the binary point), 0..30.

    Returns:
        An int64 array of the same shape.

    Raises:
        FormatError: on a non-finite value or a magnitude of ``2**QMAX_BITS`` or more.
    """
    if not 0 <= scale <= 30:
        raise FormatError(f"circuit: scale must be in [0, 30], got {scale}")
    arr = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise FormatError("circuit: cannot quantise a non-finite value")
    q = np.rint(np.ldexp(arr, scale))  # np.rint rounds half to even
    if q.size and float(np.max(np.abs(q))) >= 2.0**QMAX_BITS:
        raise FormatError(
            f"circuit: a value reaches 2**{QMAX_BITS - scale}, outside the quantisation range "
            f"at scale {scale}"
        )
    return q.astype(np.int64)


def dequantize(q: np.ndarray, scale: int) -> np.ndarray:
    """Map quantised integers back to float32 (exact for ``|q| < 2**24``)."""
    return np.ldexp(np.asarray(q, dtype=np.float64), -scale).astype(np.float32)


def snap(values: np.ndarray, scale: int) -> np.ndarray:
    """Round float values onto the scale-``s`` grid (``dequantize(quantize(v))``)."""
    return dequantize(quantize(values, scale), scale)


def int_to_felt(value: int) -> str:
    """Encode a signed integer as a field element: 32 little-endian bytes, lowercase hex."""
    return (int(value) % P).to_bytes(32, "little").hex()


def felt_to_int(felt: str) -> int:
    """Decode a field element (little-endian hex) to a signed integer in (-P/2, P/2].

    Raises:
        FormatError: on a malformed string or a value not below P.
    """
    if (
        not isinstance(felt, str)
        or len(felt) != FELT_HEX_LEN
        or not set(felt) <= set("0123456789abcdef")
    ):
        raise FormatError("circuit: a field element must be 64 lowercase hex characters")
    v = int.from_bytes(bytes.fromhex(felt), "little")
    if v >= P:
        raise FormatError("circuit: a field element is not reduced modulo P")
    return v - P if v > (P - 1) // 2 else v


def tensor_felts(values: np.ndarray, scale: int) -> list[str]:
    """Quantise a tensor and encode its elements (row-major) as field elements."""
    return [int_to_felt(v) for v in quantize(values, scale).ravel().tolist()]


def felts_to_array(felts: Iterable[str], shape: tuple[int, ...]) -> np.ndarray:
    """Decode field elements to an int64 array of ``shape`` (bounded to ``2**QMAX_BITS``).

    Raises:
        FormatError: on a wrong count, a malformed element or a magnitude out of range.
    """
    ints = [felt_to_int(f) for f in felts]
    if len(ints) != int(np.prod(shape, dtype=np.int64)):
        raise FormatError(f"circuit: {len(ints)} field elements do not fill shape {shape}")
    if any(abs(v) >= 1 << QMAX_BITS for v in ints):
        raise FormatError("circuit: a decoded value is outside the quantisation range")
    return np.array(ints, dtype=np.int64).reshape(shape)


def poseidon_digest(felts: list[str]) -> str:
    """EZKL's Poseidon hash of a list of field elements (one field element, hex)."""
    try:
        import ezkl
    except ImportError as e:  # pragma: no cover - exercised only without the zk extra
        raise BackendUnavailable("Poseidon digests need ezkl: pip install 'dk-pol[zk]'") from e
    if not felts or len(felts) > MAX_ELEMENTS:
        raise FormatError(f"circuit: can digest 1..{MAX_ELEMENTS} elements, got {len(felts)}")
    (digest,) = ezkl.poseidon_hash(felts)
    return str(digest)


def digest_felts(felts: list[str], kind: str) -> str:
    """Digest a list of field elements: EZKL Poseidon, or tagged SHA-256 of their bytes.

    Args:
        felts: field elements (64-hex, little-endian).
        kind: ``"poseidon"`` (a field element) or ``"sha256"`` (``tagged_hash(TAG_TENSOR,
            u64(n) || bytes)``, 64 hex).
    """
    if kind == "poseidon":
        return poseidon_digest(felts)
    if kind != "sha256":
        raise ValueError(f"unknown digest kind {kind!r}")
    if not felts or len(felts) > MAX_ELEMENTS:
        raise FormatError(f"circuit: can digest 1..{MAX_ELEMENTS} elements, got {len(felts)}")
    return tagged_hash(TAG_TENSOR, u64(len(felts)), bytes.fromhex("".join(felts))).hex()


def combine_digests(digests: list[str], kind: str) -> str:
    """Digest of a tensor set from its per-tensor digests (sorted-name order)."""
    if kind == "poseidon":
        return poseidon_digest(digests)
    if kind != "sha256":
        raise ValueError(f"unknown digest kind {kind!r}")
    return tagged_hash(TAG_TENSOR_SET, u64(len(digests)), bytes.fromhex("".join(digests))).hex()


def tensor_digests(
    tensors: Mapping[str, np.ndarray], scale: int, kind: str = "poseidon"
) -> dict[str, str]:
    """Per-tensor digests of the quantised tensors, in sorted-name order.

    Args:
        tensors: named float tensors (a checkpoint's parameters, or a batch).
        scale: the fixed-point scale.
        kind: ``"poseidon"`` or ``"sha256"`` (see :func:`digest_felts`).

    Returns:
        ``{name: digest_hex}`` with names sorted.
    """
    return {
        name: digest_felts(tensor_felts(tensors[name], scale), kind) for name in sorted(tensors)
    }


def tensor_digest(tensors: Mapping[str, np.ndarray], scale: int, kind: str = "poseidon") -> str:
    """The digest of a named tensor set (SPEC IV §3.3).

    The digest combines the per-tensor digests of :func:`tensor_digests` in sorted-name
    order (``Poseidon(d_1, ..., d_n)`` for ``kind="poseidon"``): what a zk-mode checkpoint
    commitment carries.
    """
    if not tensors:
        raise FormatError("circuit: cannot digest an empty tensor set")
    return combine_digests(list(tensor_digests(tensors, scale, kind).values()), kind)
