"""Kernels: properties of the references and agreement of the Numba twins with them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dk.compress import _kernels as K
from dk.compress import reference as R

FINITE = st.floats(-(2.0**100), 2.0**100, width=32, allow_subnormal=True)


@pytest.fixture(params=["reference", "numba"])
def impl(request):
    """Either implementation, by kernel name (py_ecc style twin fixture)."""
    mod, suffix = (R, "_reference") if request.param == "reference" else (K, "_numba")
    return lambda name: getattr(mod, name + suffix)


def test_splitmix64_known_values(impl):
    # SplitMix64 from state 0: the published first outputs of the generator.
    out = np.zeros(3, dtype=np.uint64)
    impl("rng")(0, 0, out)
    assert [hex(int(v)) for v in out] == [
        "0xe220a8397b1dcdaf",
        "0x6e789e6aa1b965f4",
        "0x6c45d188009454f",
    ]


def test_uniform_in_unit_interval(impl):
    u = np.zeros(10_000, dtype=np.float32)
    impl("uniform")(123, 2**64 - 5000, u)  # counter wraps around 2**64
    assert u.min() >= 0 and u.max() < 1 and abs(float(u.mean()) - 0.5) < 0.02


def test_topk_selects_largest_with_lower_index_tie_rule(impl):
    x = np.array([1.0, -3.0, 2.0, 3.0, -2.0, 0.5, 3.0], dtype=np.float32)
    idx, val = np.zeros(4, np.uint32), np.zeros(4, np.float32)
    assert impl("topk_exact")(x, 4, idx, val) == 4
    # |x| = 3, 3, 3 then the tie at 2 goes to index 2 (lower than 4)
    assert idx.tolist() == [1, 2, 3, 6] and val.tolist() == [-3.0, 2.0, 3.0, 3.0]


def test_topk_edge_cases(impl):
    x = np.zeros(5, dtype=np.float32)
    idx, val = np.zeros(5, np.uint32), np.zeros(5, np.float32)
    assert impl("topk_exact")(x, 0, idx, val) == 0
    assert impl("topk_exact")(x, 9, idx, val) == 5 and idx.tolist() == [0, 1, 2, 3, 4]
    x = np.array([-0.0, 0.0, np.inf, -np.inf, 1.0], dtype=np.float32)
    assert impl("topk_exact")(x, 2, idx, val) == 2 and idx[:2].tolist() == [2, 3]


def test_int4_packing_layout(impl):
    x = np.array([7.0, -7.0, 1.0], dtype=np.float32)
    packed, scale = np.zeros(2, np.uint8), np.zeros(1, np.float32)
    impl("quantize_int4")(x, 4, packed, scale)
    assert scale.tolist() == [1.0] and packed.tolist() == [0x97, 0x01]  # -7 = 0x9, 7 = 0x7
    out = np.zeros(3, np.float32)
    impl("dequantize_int4")(packed, scale, 4, out)
    assert out.tolist() == [7.0, -7.0, 1.0]


def test_int8_error_bound(impl):
    x = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    q, s, out = np.zeros(1000, np.int8), np.zeros(4, np.float32), np.zeros(1000, np.float32)
    impl("quantize_int8")(x, 256, q, s)
    impl("dequantize_int8")(q, s, 256, out)
    per = np.repeat(s, 256)[:1000]
    assert np.all(np.abs(out - x) <= per * 0.5001) and np.abs(q).max() == 127


def test_qsgd_is_unbiased_and_replayable(impl):
    x = np.full(20_000, 0.3, dtype=np.float32)
    x[0] = 1.0
    q, s, out = np.zeros(x.size, np.int8), np.zeros(1, np.float32), np.zeros(x.size, np.float32)
    impl("quantize_qsgd")(x, x.size, 4, 9, 0, q, s)
    impl("dequantize_qsgd")(q, s, x.size, 4, out)
    assert set(np.unique(q[1:]).tolist()) == {1, 2} and abs(out[1:].mean() - 0.3) < 0.005
    q2 = np.zeros_like(q)
    impl("quantize_qsgd")(x, x.size, 4, 9, 0, q2, s)
    assert np.array_equal(q, q2)


@settings(max_examples=60, deadline=None)
@given(
    x=hnp.arrays(np.float32, st.integers(1, 300), elements=FINITE),
    frac=st.floats(0.0, 1.0),
    block=st.integers(1, 70),
    seed=st.integers(0, 2**64 - 1),
    counter=st.integers(0, 2**64 - 1),
)
def test_numba_matches_reference(x, frac, block, seed, counter):
    n = x.size
    k = int(frac * n)
    pairs = [(np.zeros(max(k, 1), np.uint32), np.zeros(max(k, 1), np.float32)) for _ in range(2)]
    assert R.topk_exact_reference(x, k, *pairs[0]) == K.topk_exact_numba(x, k, *pairs[1])
    assert np.array_equal(pairs[0][0], pairs[1][0])
    assert np.array_equal(pairs[0][1].view(np.uint32), pairs[1][1].view(np.uint32))
    thr = R.sample_threshold_reference(x, max(k, 1), 64, seed, counter)
    assert thr == K.sample_threshold_numba(x, max(k, 1), 64, seed, counter)
    assert R.select_threshold_reference(x, thr, *pairs[0]) == K.select_threshold_numba(
        x, thr, *pairs[1]
    )
    assert np.array_equal(pairs[0][0], pairs[1][0])
    nb = -(-n // block)
    for name, dtype, size, extra in [
        ("int8", np.int8, n, ()),
        ("int4", np.uint8, (n + 1) // 2, ()),
        ("qsgd", np.int8, n, (5, seed, counter)),
    ]:
        outs = [(np.zeros(size, dtype), np.zeros(nb, np.float32)) for _ in range(2)]
        dq = [np.zeros(n, np.float32) for _ in range(2)]
        getattr(R, f"quantize_{name}_reference")(x, block, *extra, *outs[0])
        getattr(K, f"quantize_{name}_numba")(x, block, *extra, *outs[1])
        assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])
        lv = (5,) if name == "qsgd" else ()
        getattr(R, f"dequantize_{name}_reference")(*outs[0], block, *lv, dq[0])
        getattr(K, f"dequantize_{name}_numba")(*outs[0], block, *lv, dq[1])
        assert np.array_equal(dq[0].view(np.uint32), dq[1].view(np.uint32))
