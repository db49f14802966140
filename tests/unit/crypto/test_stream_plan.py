"""tensors_root's cached stream plan gives the reference root (SPEC §4.2), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from dk.crypto import encoding as enc
from dk.crypto.merkle import merkle_root
from dk.errors import FormatError


def _reference(tensors: dict[str, np.ndarray]) -> bytes:
    return merkle_root(enc.chunk_leaf_hashes(tensors, threads=1))


def _random_set(rng: np.random.Generator) -> dict[str, np.ndarray]:
    dtypes = ["<f4", "<f8", "<i8", "|u1", "<i4", "<u8"]
    out = {}
    for _ in range(int(rng.integers(0, 7))):
        if rng.random() < 0.3:  # big: chunk boundaries inside tensors and inside headers
            shape: tuple[int, ...] = (int(rng.integers(1, 20000)),)
        else:
            shape = tuple(int(rng.integers(0, 5)) for _ in range(int(rng.integers(0, 4))))
        name = "/".join(f"n{rng.integers(0, 1000)}" for _ in range(int(rng.integers(1, 4))))
        dt = dtypes[int(rng.integers(0, len(dtypes)))]
        out[name] = np.asarray(rng.random(shape) * 100).astype(dt)  # 0-d stays an array
    return out


def test_plan_root_is_the_reference_root() -> None:
    rng = np.random.default_rng(7)
    multi = 0
    for _ in range(150):
        t = _random_set(rng)
        want = _reference(t)
        assert enc.tensors_root(t) == want  # builds the plan
        assert enc._plan_for(t) is not None
        assert enc.tensors_root(t) == want  # from the cached plan
        multi += sum(v.nbytes for v in t.values()) > enc.CHUNK_SIZE
    assert multi > 10  # multi-chunk sets were covered


def test_header_straddling_a_chunk_boundary() -> None:
    first = np.zeros(enc.CHUNK_SIZE // 4 - 10, dtype="<f4")  # its end lands near the boundary
    for pad in range(0, 40, 3):
        t = {"a": first[: len(first) - pad], "b/very/long/name": np.arange(9.0), "c": np.array(2)}
        assert enc.tensors_root(t) == _reference(t)


def test_the_cache_holds_the_schema_not_the_values() -> None:
    t = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "s": np.array(3, dtype=np.int64)}
    r1 = enc.tensors_root(t)
    t2 = {"w": t["w"] + 1, "s": t["s"]}
    assert enc.tensors_root(t2) == _reference(t2) != r1


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(12, dtype=">f4").reshape(3, 4),  # big-endian
        np.arange(12, dtype="<f4").reshape(3, 4).T,  # not C-contiguous
        np.arange(12, dtype="<f8")[::2],  # strided
    ],
)
def test_other_layouts_take_the_reference_path(arr: np.ndarray) -> None:
    t = {"x": arr}
    assert enc._plan_for(t) is None
    assert enc.tensors_root(t) == _reference(t)


def test_bad_tensors_raise_as_the_reference_does() -> None:
    for bad in ({"x": np.zeros(3, dtype=np.float16)}, {"x": np.zeros((1,) * 9)}, {"": np.zeros(1)}):
        with pytest.raises(FormatError):
            enc.tensors_root(bad)


def test_a_schema_is_its_names_shapes_and_dtypes() -> None:
    """Sets with the same names and shapes but another dtype (or shape) do not share a plan:
    each gives its own reference root."""
    base = {"a": np.arange(6, dtype="<f4").reshape(2, 3), "b": np.zeros(4, dtype="<i8")}
    variants = [
        base,
        {**base, "a": base["a"].astype("<i4")},  # same size, another dtype
        {**base, "b": base["b"].astype("<f8")},
        {**base, "a": base["a"].reshape(3, 2)},  # same dtype, another shape
    ]
    roots = []
    for t in variants * 2:  # the second round from cached plans
        assert enc.tensors_root(t) == _reference(t)
        roots.append(enc.tensors_root(t))
    assert len(set(roots)) == len(variants)
