"""Each Numba CPU kernel against its NumPy float64 reference on fresh random inputs, both as
Numba compiles it at run time (``jit``) and as ``dk.pol.exact.aot`` compiles it ahead of time.

Bounds (u = 2**-24): a blocked sum of K terms is within (BLOCK + ceil(K / BLOCK) + 1) u of the
exact value relative to the sum of absolute terms; elementwise kernels built on exp / log / erf
are within 1e-6 relative (+ 1e-7 absolute near zero). The matmul is also checked bit for bit
against a NumPy float32 emulation of the specified order.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dk.pol.exact import _cpu
from dk.pol.exact import reference as ref

from ._exact_cases import compiled_kernels

U = 2.0**-24
BLOCK = 32


@pytest.fixture(params=["jit", "aot"])
def kern(request: pytest.FixtureRequest) -> object:
    """The kernels: ``_cpu``'s JIT kernels, or the ahead-of-time ones under the same names."""
    return _cpu if request.param == "jit" else compiled_kernels()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261124)  # seeded: a failure reproduces


def _gamma(k: int) -> float:
    return (BLOCK + math.ceil(k / BLOCK) + 1) * U


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def emulate_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The specified order, element-parallel in NumPy float32 (an executable spec)."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k0 in range(0, a.shape[1], BLOCK):
        t = np.zeros_like(acc)
        for k in range(k0, min(k0 + BLOCK, a.shape[1])):
            t = t + a[:, k : k + 1] * b[k : k + 1, :]
        acc = acc + t
    return acc


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 3), (13, 70, 17), (64, 100, 33)])
@pytest.mark.parametrize("trans", [False, True])
def test_matmul_matches_reference_and_order(kern, rng, m, k, n, trans) -> None:  # type: ignore[no-untyped-def]
    a = _f32(rng, k, m).T if trans else _f32(rng, m, k)
    b = _f32(rng, k, n)
    c = np.empty((m, n), np.float32)
    kern.matmul(a, b, c)
    want = np.empty((m, n))
    ref.matmul(a, b, want)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    assert np.all(np.abs(c - want) <= _gamma(k) * scale)
    assert np.array_equal(
        c.view(np.uint32), emulate_matmul(np.ascontiguousarray(a), b).view(np.uint32)
    )


def test_rowsum_sum_and_bias(kern, rng) -> None:  # type: ignore[no-untyped-def]
    a = _f32(rng, 9, 200)
    out = np.empty(9, np.float32)
    kern.rowsum(a, out)
    want = np.empty(9)
    ref.rowsum(a, want)
    assert np.all(np.abs(out - want) <= _gamma(200) * np.abs(a).sum(axis=1))
    v = a[0]
    assert abs(kern.sum_blocked(v) - ref.sum_blocked(v)) <= _gamma(200) * np.abs(v).sum()
    c, bias = _f32(rng, 9, 4), _f32(rng, 9)
    c64 = c.astype(np.float64)
    kern.add_bias_rows(c, bias)
    ref.add_bias_rows(c64, bias)
    assert np.allclose(c, c64, rtol=U, atol=U)


@pytest.mark.parametrize("kind", ["relu", "gelu"])
def test_activations(kern, rng, kind) -> None:  # type: ignore[no-untyped-def]
    z, dh = _f32(rng, 5000) * 4, _f32(rng, 5000)
    h, dz = np.empty_like(z), np.empty_like(z)
    h64, dz64 = np.empty(5000), np.empty(5000)
    getattr(kern, f"{kind}_fwd")(z, h)
    getattr(kern, f"{kind}_bwd")(z, dh, dz)
    getattr(ref, f"{kind}_fwd")(z, h64)
    getattr(ref, f"{kind}_bwd")(z, dh, dz64)
    np.testing.assert_allclose(h, h64, rtol=1e-6, atol=1e-7)
    # gelu'(z) = Phi(z) + z phi(z) cancels near z = -0.75: bound relative to |dh| (<= 16 ulp)
    assert np.all(np.abs(dz - dz64) <= 16 * U * np.abs(dh) + 1e-7 * np.abs(dz64))


def test_softmax_ce(kern, rng) -> None:  # type: ignore[no-untyped-def]
    zt, y = _f32(rng, 45, 16) * 5, rng.integers(0, 45, 16).astype(np.int64)
    dz, losses = np.empty_like(zt), np.empty(16, np.float32)
    dz64, losses64 = np.empty(zt.shape), np.empty(16)
    kern.softmax_ce(zt, y, dz, losses)
    ref.softmax_ce(zt, y, dz64, losses64)
    np.testing.assert_allclose(losses, losses64, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dz, dz64, rtol=1e-5, atol=1e-7 / 16)


def test_mse(kern, rng) -> None:  # type: ignore[no-untyped-def]
    zt, target = _f32(rng, 40, 8), _f32(rng, 8, 40)
    dz, losses = np.empty_like(zt), np.empty(8, np.float32)
    dz64, losses64 = np.empty(zt.shape), np.empty(8)
    kern.mse(zt, target, dz, losses)
    ref.mse(zt, target, dz64, losses64)
    np.testing.assert_allclose(losses, losses64, rtol=_gamma(40) * 4)
    np.testing.assert_allclose(dz, dz64, rtol=2 * U)


def test_im2col_col2im_pool(kern, rng) -> None:  # type: ignore[no-untyped-def]
    x = _f32(rng, 3, 2, 8, 4)
    col, colt = np.empty((27, 64), np.float32), np.empty((64, 27), np.float32)
    col64, colt64 = np.empty((27, 64)), np.empty((64, 27))
    kern.im2col(x, col, colt)
    ref.im2col(x, col64, colt64)
    assert np.array_equal(col, col64) and np.array_equal(colt, colt64)
    dx, dx64 = np.empty(x.shape, np.float32), np.empty(x.shape)
    kern.col2im(col, dx)
    ref.col2im(col, dx64)
    np.testing.assert_allclose(dx, dx64, rtol=10 * U, atol=1e-6)
    out, idx = np.empty((3, 2, 4, 2), np.float32), np.empty((3, 2, 4, 2), np.int32)
    out64, idx64 = np.empty(out.shape), np.empty(out.shape, np.int64)
    kern.maxpool_fwd(x, out, idx)
    ref.maxpool_fwd(x, out64, idx64)
    assert np.array_equal(out, out64) and np.array_equal(idx, idx64)
    g, gx64 = _f32(rng, *out.shape), np.empty(x.shape)
    gx = np.empty_like(x)
    kern.maxpool_bwd(g, idx, gx)
    ref.maxpool_bwd(g, idx, gx64)
    assert np.array_equal(gx, gx64)


@pytest.mark.parametrize("flags", [0, 1, 2, 3, 6, 7])
def test_sgd_update(kern, rng, flags) -> None:  # type: ignore[no-untyped-def]
    p, g, buf = _f32(rng, 300), _f32(rng, 300), _f32(rng, 300)
    p64, buf64 = p.astype(np.float64), buf.astype(np.float64)
    hyper = (np.float32(0.05), np.float32(0.9), np.float32(0.01))
    kern.sgd_update(p, g, buf, *hyper, flags)
    ref.sgd_update(p64, g, buf64, *(float(h) for h in hyper), flags)
    np.testing.assert_allclose(p, p64, rtol=4 * U, atol=1e-7)
    np.testing.assert_allclose(buf, buf64, rtol=4 * U, atol=1e-7)


@pytest.mark.parametrize("flags", [0, 1])
def test_adam_update(kern, rng, flags) -> None:  # type: ignore[no-untyped-def]
    p, g = _f32(rng, 300), _f32(rng, 300)
    m, v = _f32(rng, 300) * 0.1, np.abs(_f32(rng, 300)) * 0.01
    p64, m64, v64 = (a.astype(np.float64) for a in (p, m, v))
    m_in, v_in = m64.copy(), v64.copy()
    hyper = np.array([1e-3, 0.9, 0.1, 0.999, 0.001, 1e-8, 0.01, 0.271, 0.002997], np.float32)
    kern.adam_update(p, g, m, v, hyper, flags)
    ref.adam_update(p64, g, m64, v64, hyper, flags)
    gg = np.abs(g) + (0.01 * np.abs(p64) if flags else 0.0)
    m_scale = 0.9 * np.abs(m_in) + 0.1 * gg
    assert np.all(np.abs(m - m64) <= 4 * U * m_scale)
    assert np.all(np.abs(v - v64) <= 4 * U * (0.999 * v_in + 0.001 * gg * gg))
    np.testing.assert_allclose(p, p64, rtol=2 * U, atol=1e-3 * 1e-5)
