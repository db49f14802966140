"""Field kernels (Numba) against their NumPy references on fresh random inputs (SPEC §VII.2)."""

from __future__ import annotations

import numpy as np
import pytest

from dk.fl.field import HALF, P, dequantize, field_kernel, quantize


@pytest.fixture(params=[1, 2, 3])
def rng(request):
    return np.random.default_rng(request.param)


def _elems(rng, n):
    e = rng.integers(0, P, size=n, dtype=np.uint64)
    e[:4] = [0, 1, P - 1, HALF]  # edges
    return e


@pytest.mark.parametrize("name", ["add", "sub"])
def test_add_sub_match_reference(rng, name):
    a, b = _elems(rng, 10_001), _elems(rng, 10_001)[::-1].copy()
    ref, got = np.empty_like(a), np.empty_like(a)
    field_kernel(name, "reference")(a, b, P, ref)
    field_kernel(name, "numba")(a, b, P, got)
    np.testing.assert_array_equal(ref, got)
    exact = (a.astype(object) + b.astype(object)) if name == "add" else (a.astype(object) - b)
    np.testing.assert_array_equal(ref, np.array([int(v) % P for v in exact], dtype=np.uint64))


def test_quantize_matches_reference(rng):
    x = (rng.standard_normal(10_001) * 3).astype(np.float32)
    x[:5] = [0.5 / 256, -0.5 / 256, 1.5 / 256, 100.0, -100.0]  # ties (half to even), clipping
    ref, got = np.empty(x.size, np.uint64), np.empty(x.size, np.uint64)
    field_kernel("quantize", "reference")(x, 256.0, 4.0, P, ref)
    field_kernel("quantize", "numba")(x, 256.0, 4.0, P, got)
    np.testing.assert_array_equal(ref, got)
    assert list(ref[:5]) == [0, 0, 2, 1024, P - 1024]


def test_dequantize_matches_reference(rng):
    s = _elems(rng, 10_001)
    ref, got = np.empty(s.size), np.empty(s.size)
    field_kernel("dequantize", "reference")(s, 1024.0, P, ref)
    field_kernel("dequantize", "numba")(s, 1024.0, P, got)
    np.testing.assert_array_equal(ref, got)
    assert ref[2] == -1 / 1024 and ref[3] == HALF / 1024


def test_quantized_sum_round_trips(rng):
    xs = [(rng.standard_normal(1000)).astype(np.float32) for _ in range(5)]
    acc = np.zeros(1000, np.uint64)
    for x in xs:
        field_kernel("add")(acc, quantize(x, scale=2.0**16, clip=8.0, n=5), P, acc)
    got = dequantize(acc, scale=2.0**16)
    np.testing.assert_allclose(got, np.sum(np.clip(xs, -8, 8), axis=0), atol=5 * 2.0**-17)


def test_quantize_refuses_wraparound():
    with pytest.raises(ValueError, match="p/2"):
        quantize(np.zeros(3, np.float32), scale=2.0**24, clip=100.0, n=10)


def test_reject_matches_reference(rng):
    words = rng.integers(0, 2**32, size=5000, dtype=np.uint64).astype(np.uint32)
    words[rng.integers(0, 5000, 300)] = rng.integers(P, 2**32, 300).astype(np.uint32)  # rejects
    for start, size in ((0, 6000), (0, 4000), (1000, 3000)):
        ref, got = np.zeros(size, np.uint64), np.zeros(size, np.uint64)
        a = field_kernel("reject", "reference")(words, P, ref, start)
        b = field_kernel("reject", "numba")(words, P, got, start)
        assert a == b and np.array_equal(ref, got)
        kept = words[words < P][: size - start]
        assert a == start + kept.size and np.array_equal(ref[start:a], kept)
