"""CUDA kernels against the NumPy references, under Numba's simulator (or on a GPU)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

if "numba.cuda" not in sys.modules and not os.environ.get("DK_CUDA_REAL"):
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # must precede the first numba.cuda import
    from numba.core import config

    config.reload_config()

from numba import cuda

from dk.compress import reference as R

if not cuda.is_available():  # tests/conftest.py enables the simulator unless DK_CUDA_REAL=1
    raise RuntimeError("no CUDA: run with the simulator (default) or on a GPU with DK_CUDA_REAL=1")

from dk.compress import _cuda as C

SIZES = [1, 7, 300, 1100]  # the simulator runs each CUDA thread as a Python thread


@pytest.mark.parametrize("n", SIZES)
def test_topk_and_threshold_select(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    x[::5] = x[0]  # ties across chunks
    for k in sorted({1, n // 7 + 1, n}):
        ref = (np.zeros(k, np.uint32), np.zeros(k, np.float32))
        got = (np.zeros(k, np.uint32), np.zeros(k, np.float32))
        assert R.topk_exact_reference(x, k, *ref) == C.topk_exact_cuda(x, k, *got)
        assert np.array_equal(ref[0], got[0]) and np.array_equal(ref[1], got[1])
    thr = R.sample_threshold_reference(x, max(1, n // 10), 100, 1, 2)
    ref = (np.zeros(5, np.uint32), np.zeros(5, np.float32))
    got = (np.zeros(5, np.uint32), np.zeros(5, np.float32))
    assert R.select_threshold_reference(x, thr, *ref) == C.select_threshold_cuda(x, thr, *got)
    assert np.array_equal(ref[0], got[0])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("block", [1, 5, 64])
def test_block_quantization(n, block):
    x = np.random.default_rng(block).standard_normal(n).astype(np.float32)
    x[0] = 0.0
    x[-1] = 127.5 * 2.0**-10  # rounding ties are resolved to even, as np.rint does
    nb = -(-n // block)
    for name, dtype, size in [("int8", np.int8, n), ("int4", np.uint8, (n + 1) // 2)]:
        ref = (np.zeros(size, dtype), np.zeros(nb, np.float32))
        got = (np.zeros(size, dtype), np.zeros(nb, np.float32))
        getattr(R, f"quantize_{name}_reference")(x, block, *ref)
        getattr(C, f"quantize_{name}_cuda")(x, block, *got)
        assert np.array_equal(ref[0], got[0]) and np.array_equal(ref[1], got[1])


def test_generator():
    ref, got = np.zeros(300, np.uint64), np.zeros(300, np.uint64)
    R.rng_reference(2**64 - 1, 2**64 - 5, ref)
    C.rng_cuda(2**64 - 1, 2**64 - 5, got)
    assert np.array_equal(ref, got)
