"""Blocked float64 convolutions (SPEC VI §2): every element within γ_K'·S of the exact sum."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dk.pol.backends import blocked, kernels64

torch.set_num_threads(1)
_U = 2.0**-53
_CONV = torch.ops.aten.convolution.default
_BACK = torch.ops.aten.convolution_backward.default


def _aten(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return func(*args, **kwargs)


def _gamma(k: int) -> float:
    return k * _U / (1 - k * _U)


def test_compensated_sum_adds_what_plain_float64_loses() -> None:
    big = torch.tensor([1e16, -3e16], dtype=torch.float64)
    parts = [big, torch.tensor([1.0, 0.5], dtype=torch.float64), -big]
    assert blocked.sum_parts(parts).tolist() == [1.0, 0.5]
    assert (parts[0] + parts[1] + parts[2]).tolist() != [1.0, 0.5]  # the plain sum loses them


def test_an_infinite_part_gives_infinity_not_nan() -> None:
    inf = torch.tensor([float("inf"), 1.0], dtype=torch.float64)
    got = blocked.sum_parts([torch.ones(2, dtype=torch.float64), inf])
    assert got.tolist() == [float("inf"), 2.0]


@pytest.mark.parametrize("m", [1, 2, 3, 7, 64, 129])
def test_compensated_sum_is_within_2u_of_fsum_on_both_paths(m: int) -> None:
    """The CPU path (Numba) and the vectorised path (any device) give the same bits, within
    ``2u·Σ|parts|`` of the exact sum."""
    g = torch.Generator().manual_seed(m)
    # cancelling parts over 40 binades: a plain float64 sum is far off here
    parts = [
        (torch.randn(200, generator=g, dtype=torch.float64) * 2.0 ** (i % 40)) * (-1) ** i
        for i in range(m)
    ]
    got = blocked.sum_parts(parts)
    vec = blocked.Compensated()
    for p in parts:
        vec.add_vectorised(p)
    assert torch.equal(vec.result(), got)
    stack = torch.stack(parts).numpy()
    for j in range(stack.shape[1]):
        exact = math.fsum(stack[:, j].tolist())
        assert abs(float(got[j]) - exact) <= 2 * _U * float(np.abs(stack[:, j]).sum())


def _exact_conv2d(x: torch.Tensor, w: torch.Tensor, stride: int, pad: int, dil: int) -> Any:
    """(exact sums by fsum, S) of a 2-D convolution, groups = 1, float64 inputs."""
    n, _, h, wd = x.shape
    co, _, kh, kw = w.shape
    cols = F.unfold(x, (kh, kw), dilation=dil, padding=pad, stride=stride)  # exact copies
    ho = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    wo = (wd + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    wf = w.reshape(co, -1)
    prods = wf[None, :, :, None] * cols[:, None, :, :]  # (n, co, K, L): exact float64 products
    pn = prods.numpy()
    exact = np.empty((n, co, ho * wo))
    for i in np.ndindex(n, co, ho * wo):
        exact[i] = math.fsum(pn[i[0], i[1], :, i[2]].tolist())
    s = np.abs(pn).sum(axis=2)
    return exact.reshape(n, co, ho, wo), s.reshape(n, co, ho, wo)


@pytest.mark.parametrize("fast", [False, True])  # by ATen calls per block; one im2col (kernels64)
@pytest.mark.parametrize(("cin", "k", "stride", "pad", "dil"), [(20, 3, 1, 1, 1), (9, 3, 2, 0, 2),
                                                                (70, 1, 1, 0, 1)])  # fmt: skip
def test_blocked_forward_is_within_its_bound(
    cin: int, k: int, stride: int, pad: int, dil: int, fast: bool
) -> None:
    g = torch.Generator().manual_seed(cin)
    # float32 values (products exact in float64), large offset: sums that cancel
    x = (torch.randn(2, cin, 7, 7, generator=g) + 30.0).double()
    w = torch.randn(5, cin, k, k, generator=g).double()
    w = (w - w.mean(dim=(1, 2, 3), keepdim=True)).float().double()  # rows summing to ~0
    args = (x, w, None, [stride] * 2, [pad] * 2, [dil] * 2, False, [0, 0], 1)
    before = kernels64.calls["convolution_blocked"]
    got = blocked.convolution(args, _aten, _CONV, fast).numpy()
    blocks = fast and cin > max(1, 64 // (k * k))
    assert kernels64.calls["convolution_blocked"] - before == int(blocks)
    exact, s = _exact_conv2d(x, w, stride, pad, dil)
    kfull = cin * k * k
    (kb,) = blocked.block_terms("convolution", args, [kfull])
    assert kb == (kfull if cin <= 64 // (k * k) else (64 // (k * k)) * k * k + 8)
    assert np.all(np.abs(got - exact) <= _gamma(kb) * s)


def test_blocked_forward_with_groups_bias_and_transposed_matches_aten() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 24, 6, 6, generator=g).double()
    for transposed in (False, True):
        w = torch.randn(24, 4, 3, 3, generator=g).double() if transposed else (
            torch.randn(12, 8, 3, 3, generator=g).double())  # fmt: skip
        b = torch.randn(12, generator=g).double()
        args = (x, w, b, [1, 1], [1, 1], [1, 1], transposed, [0, 0], 3)
        want = _CONV(*args)
        calls: list[int] = []

        def counting(func: Any, a: tuple[Any, ...], kw: dict[str, Any], c: Any = calls) -> Any:
            c.append(int(a[0].shape[1]))
            return func(*a, **kw)

        got = blocked.convolution(args, counting, _CONV)
        assert calls == [3 * 7, 3 * 1]  # 8 channels per group: blocks of 7 and 1, all groups
        assert got.shape == want.shape
        assert torch.allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("groups", [1, 2])
def test_blocked_backward_matches_aten_and_blocks(transposed: bool, groups: int) -> None:
    g = torch.Generator().manual_seed(groups)
    x = torch.randn(10, 16, 5, 5, generator=g).double()
    w = (torch.randn(16, 24 // groups, 3, 3, generator=g) if transposed else
         torch.randn(24, 16 // groups, 3, 3, generator=g)).double()  # fmt: skip
    out = _CONV(x, w, None, [1, 1], [1, 1], [1, 1], transposed, [0, 0], groups)
    go = torch.randn(out.shape, generator=g).double()
    args = (go, x, w, [out.shape[1]], [1, 1], [1, 1], [1, 1], transposed, [0, 0], groups,
            [True, True, True])  # fmt: skip
    calls: list[int] = []

    def counting(func: Any, a: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        calls.append(int(a[0].shape[0]))
        return func(*a, **kw)

    want = _BACK(*args)
    got = blocked.convolution_backward(args, counting, _BACK)
    for gv, wv in zip(got, want, strict=True):
        assert gv.shape == wv.shape
        assert torch.allclose(gv, wv, rtol=0, atol=1e-11)
    assert calls == [10, 2, 2, 2, 2, 2]  # the input gradient, then blocks of 2 images of 25
    ks = blocked.block_terms("convolution_backward", args, [1000, 250, 250])
    assert ks == [1000, 2 * 25 + 8, 2 * 25 + 8]  # the input gradient is not blocked


@pytest.mark.parametrize("fast", [False, True])
def test_weight_gradient_is_within_its_blocked_bound(fast: bool) -> None:
    """8 images × 8×8 positions = 512 terms per weight element, blocked by one image (64)."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(8, 2, 8, 8, generator=g) + 20.0).double()
    go = torch.randn(8, 3, 8, 8, generator=g).double()
    w = torch.randn(3, 2, 3, 3, generator=g).double()
    args = (go, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False])
    before = kernels64.calls["weight_grad_blocks"]
    gw = blocked.convolution_backward(args, _aten, _BACK, fast)[1].numpy()
    assert kernels64.calls["weight_grad_blocks"] - before == int(fast)
    cols = F.unfold(x, (3, 3), padding=1)  # (8, 18, 64)
    prods = (go.reshape(8, 3, 1, 64) * cols[:, None]).numpy()  # (n, co, ci·9, L)
    exact = np.empty((3, 18))
    for co, j in np.ndindex(3, 18):
        exact[co, j] = math.fsum(prods[:, co, j, :].ravel().tolist())
    s = np.abs(prods).sum(axis=(0, 3))
    kb = blocked.block_terms("convolution_backward", args, [None, 512, None])[1]
    assert kb == 64 + 8
    assert np.all(np.abs(gw.reshape(3, 18) - exact) <= _gamma(kb) * s)


@pytest.mark.parametrize("fast", [False, True])
def test_weight_gradient_block_sums_are_added_with_compensation(fast: bool) -> None:
    """Three images, one block each: 2^60, then 64, then -2^60 (exact block sums). Added in
    plain float64 the 64 is lost (below half an ulp of 2^60); compensated, the gradient is 64."""
    x = torch.zeros(3, 1, 8, 8, dtype=torch.float64)
    x[0], x[1], x[2] = 2.0**54, 1.0, -(2.0**54)
    go = torch.ones(3, 1, 8, 8, dtype=torch.float64)
    w = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    args = (go, x, w, [1], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [False, True, True])
    assert float(_BACK(*args)[1]) != 64.0  # the unblocked kernel loses it here
    gw, gb = blocked.convolution_backward(args, _aten, _BACK, fast)[1:]
    assert float(gw) == 64.0 and float(gb) == 192.0


def test_neumaier_running_sums() -> None:
    p = np.array([[2.0**60, 1.0], [64.0, 2.0], [-(2.0**60), 3.0]])
    s, c = np.zeros(2), np.zeros(2)
    blocked.neumaier_add(p[:2].copy(), s, c)
    blocked.neumaier_add(p[2:].copy(), s, c)
    assert blocked.finish(s, c).tolist() == [64.0, 6.0]
    assert (s + 0.0).tolist() != [64.0, 6.0]  # the running sum alone lost the 64
