"""The float64 scratch pool of the rounded backend (``pool.py``).

The pool lends tensors for the length of one covered call and reuses them afterwards; a
recorded interval with it is the same, log and weights, as one without it (a tensor taken back
while still in use would change both).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dk.pol.backends import examples as ex
from dk.pol.backends import kernels64, pool
from dk.pol.backends.pool import Pool
from dk.pol.backends.rounded import RoundedMode

A = torch.ops.aten
JOB = bytes(range(32))
BIG = (256, 256)  # 65,536 elements: pooled (MIN_NUMEL = 32,768)


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def test_a_tensor_is_reused_only_after_its_lending_ends() -> None:
    p = Pool()
    with p.lending():
        a = p.empty(BIG)
        b = p.empty(BIG)  # a is still lent: another tensor
        assert a.data_ptr() != b.data_ptr()
    with p.lending():
        c = p.empty(BIG)
        with p.lending():
            d = p.empty(BIG)
        with p.lending():
            e = p.empty(BIG)  # d's lending ended: d again, never c
    assert {c.data_ptr(), d.data_ptr()} <= {a.data_ptr(), b.data_ptr()}
    assert c.data_ptr() != d.data_ptr() and e.data_ptr() == d.data_ptr()
    assert p.reused == 3
    assert c.shape == BIG and c.dtype == torch.float64 and c.is_contiguous()


def test_small_tensors_and_a_full_pool_are_not_kept() -> None:
    p = Pool(max_free_bytes=8 * 256 * 256)  # room for one BIG tensor
    with p.lending():
        small = p.empty((10, 10))
        a, b = p.empty(BIG), p.empty(BIG)
    with p.lending():
        small2 = p.empty((10, 10))
        c, d = p.empty(BIG), p.empty(BIG)
    assert p.reused == 1
    assert (c.data_ptr() in (a.data_ptr(), b.data_ptr())) != (
        d.data_ptr() in (a.data_ptr(), b.data_ptr())
    )
    assert small.shape == small2.shape == (10, 10)
    p.clear()
    with p.lending():
        p.empty(BIG)
    assert p.reused == 1


def test_upcast_is_to_float64_with_the_same_strides() -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(512, 128, generator=g)
    cases = [w, w.t(), w[::2], w[:, 1:], torch.randn(4, 128, 64, generator=g), w[:2]]
    # size-1 dimensions with strides of their own (a Linear(n, 1) weight's transpose, a
    # transposed single head): to keeps them, and ATen picks its kernel by them
    cases += [torch.randn(1, 40000, generator=g).t()]
    cases += [torch.randn(512, 1, 64, generator=g).transpose(0, 1)]
    p = Pool()
    for a in cases:
        with p.lending():
            got = p.upcast(a)
            ref = a.to(torch.float64)
            assert got.dtype == torch.float64 and torch.equal(got, ref)
            assert got.stride() == ref.stride() and got.shape == ref.shape
    assert p.reused == 2  # w.t() took w's tensor back (the same element count), and the
    # transposed head the 4 x 128 x 64 one's


def test_products_into_a_given_tensor_are_atens() -> None:
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(64, 600, generator=g).double(), torch.randn(600, 70, generator=g).double()
    bias = torch.randn(70, generator=g).double()
    b1 = torch.randn(3, 20, 30, generator=g).double()
    b2 = torch.randn(3, 30, 40, generator=g).double()
    cases = [
        (A.mm.default, (a, b), {}),
        (A.mm.default, (a, b.t().contiguous().t()), {}),
        (A.addmm.default, (bias, a, b), {"beta": 0.5, "alpha": 2.0}),
        (A.bmm.default, (b1, b2), {}),
        (A.baddbmm.default, (torch.zeros(40).double(), b1, b2), {}),
    ]
    given: list[torch.Tensor] = []

    def empty(shape: tuple[int, ...]) -> torch.Tensor:
        given.append(torch.empty(shape, dtype=torch.float64))
        return given[-1]

    for func, args, kwargs in cases:
        got = kernels64.aten_product(func, args, kwargs, empty)
        assert got.data_ptr() == given[-1].data_ptr()
        assert torch.equal(got, func(*args, **kwargs))  # the same kernel: the same bits
        n = len(given)
        out = kernels64.matmul(func.overloadpacket.__name__, args, kwargs, empty)
        assert len(given) == n + 1 and out.data_ptr() == given[-1].data_ptr()
    assert kernels64.aten_product(A.mm.default, (a.float(), b.float()), {}, empty) is None
    assert kernels64.aten_product(A.mm.out, (a, b), {"out": given[0]}, empty) is None


def _interval(pooled: bool, products: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """One recorded interval of a small LM; ``pooled`` False: as before the pool, fresh tensors
    and products by the operation itself (ATen's ``mm``, not its ``out=`` overload)."""
    monkeypatch.setattr(pool, "MIN_NUMEL", pool.MIN_NUMEL if pooled else 1 << 62)
    monkeypatch.setattr(kernels64, "PRODUCTS", products)
    if not pooled:
        run = kernels64.run
        monkeypatch.setattr(
            kernels64, "run", lambda func, args, kwargs, empty=None: run(func, args, kwargs)
        )
    b = ex.build("lm", seed=7, width=64, batch=8)
    ex.train(b, range(1))
    mode = RoundedMode.record(job_id=JOB, interval=1)
    ex.train(b, range(1, 4), lambda: mode)
    reused = mode.pool.reused
    log = mode.finish()
    return reused, log, b["model"].state_dict()


@pytest.mark.parametrize("products", ["aten", "numpy"])
def test_an_interval_with_the_pool_is_the_same_as_without(
    products: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reused, log, state = _interval(True, products, monkeypatch)
    reused0, log0, state0 = _interval(False, products, monkeypatch)
    assert reused > 50 and reused0 == 0  # the pool ran (products, casts: every step)
    assert log.encode() == log0.encode() and log.sites == log0.sites > 0
    for k, v in state.items():
        assert torch.equal(v, state0[k]), k
