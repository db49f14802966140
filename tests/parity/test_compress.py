"""Parity: compressed training steps give identical bits with Numba and NumPy kernels."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dk.compress import CompressedSGDStep

SPECS = st.sampled_from(
    [
        "topk:0.02",
        "topk:ratio=0.1,momentum=0.9",
        "topk:ratio=0.05,approx=1,samples=32",
        "int8:block=7,ef=1",
        "int4:block=33",
        "qsgd:levels=2,block=10,seed=9",
    ]
)


@settings(max_examples=40, deadline=None)
@given(
    spec=SPECS,
    sizes=st.lists(st.integers(1, 500), min_size=1, max_size=3),
    seed=st.integers(0, 2**32 - 1),
)
def test_steps_agree_bitwise(spec, sizes, seed):
    rng = np.random.default_rng(seed)
    a = CompressedSGDStep(spec, backend="numpy")
    b = CompressedSGDStep(spec, backend="numba")
    for _ in range(4):
        grads = {f"p{i}": rng.standard_normal(n).astype(np.float32) for i, n in enumerate(sizes)}
        ga, gb = a.step(grads), b.step(grads)
        for name in grads:
            assert np.array_equal(ga[name].view(np.uint32), gb[name].view(np.uint32))
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k]) for k in sa)
