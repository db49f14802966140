"""The faster float64 CPU kernels of bounded sites (``kernels64.py``, SPEC VI §1, §2).

Each kernel's float64 result lies within ``γ_K·S`` of ATen's (``S`` computed as ``bounds.py``
does, ``K`` its term count), with ATen's shape, dtype and strides, on odd shapes (stride 2,
padding 0/2, dilation 2, bias, batch 1, non-contiguous and transposed inputs). A run recorded
with the fast kernels replays with ATen's and the reverse, to the same bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from dk.pol.backends import examples as ex
from dk.pol.backends import kernels64
from dk.pol.backends.bounds import site_bounds
from dk.pol.backends.rounded import RoundedMode

A = torch.ops.aten
JOB = bytes(range(32))


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> Any:
    """One thread; every convolution through the fast kernels, however small; matrix products
    through NumPy's, whatever this machine's CPU (``PRODUCTS``)."""
    monkeypatch.setattr(kernels64, "MIN_MACS", dict.fromkeys(kernels64.MIN_MACS, 0))
    monkeypatch.setattr(kernels64, "PRODUCTS", "numpy")
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _rand(g: torch.Generator, *shape: int) -> torch.Tensor:
    """Float32 values (as the rounded backend's inputs are), in a float64 tensor."""
    return torch.randn(*shape, generator=g).double()


def _f32(a: Any) -> Any:
    return a.float() if isinstance(a, torch.Tensor) else a


def _check(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], got: Any) -> None:
    """``got`` (the fast kernel's outputs) against ATen's float64 outputs: same shape, dtype,
    strides, and within ``γ_K·S`` elementwise, ``S`` and ``K`` as the backend computes them."""
    assert got is not None, "the fast kernel did not take this case"
    ref = func(*args, **kwargs)
    refs = list(ref) if isinstance(ref, tuple | list) else [ref]
    gots = list(got) if isinstance(got, tuple | list) else [got]
    assert len(refs) == len(gots)
    a32 = tuple([_f32(x) for x in a] if isinstance(a, list) else _f32(a) for a in args)
    bounds = site_bounds(func, a32, {k: _f32(v) for k, v in kwargs.items()}, ref)
    checked = 0
    for r, o in zip(refs, gots, strict=True):
        if r is None:
            assert o is None
            continue
        assert o.shape == r.shape and o.dtype == r.dtype == torch.float64
        assert o.stride() == r.stride()
        bound = bounds[id(r)]
        gamma = bound.k_sum * 2.0**-53 / (1 - bound.k_sum * 2.0**-53)
        diff = np.abs(o.numpy().reshape(-1) - r.contiguous().numpy().reshape(-1))
        assert (diff <= gamma * bound.s().astype(np.float64)).all(), (diff.max(), bound.k_sum)
        checked += 1
    assert checked


CONV_CASES = [  # (N, C, H, W, Co, kh, kw, stride, padding, dilation, bias)
    (4, 5, 9, 7, 6, 3, 3, [1, 1], [1, 1], [1, 1], False),
    (3, 4, 11, 10, 5, 3, 3, [2, 2], [0, 0], [1, 1], True),
    (2, 3, 12, 12, 4, 3, 3, [1, 1], [2, 2], [2, 2], True),
    (1, 6, 8, 9, 3, 3, 2, [2, 1], [1, 0], [1, 2], False),
    (5, 7, 6, 6, 8, 1, 1, [1, 1], [0, 0], [1, 1], True),
    (1, 2, 5, 5, 3, 5, 5, [1, 1], [2, 2], [1, 1], True),
]


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_convolution_within_the_bound_of_aten(case: Any, layout: str) -> None:
    n, c, h, w, co, kh, kw, stride, padding, dilation, has_bias = case
    g = torch.Generator().manual_seed(100 * CONV_CASES.index(case) + len(layout))
    x = _rand(g, n, c, h, w)
    if layout == "strided":  # a non-contiguous view: every other column of a wider input
        x = _rand(g, n, c, h, 2 * w)[:, :, :, ::2]
    wt = _rand(g, co, c, kh, kw)
    bias = _rand(g, co) if has_bias else None
    args = (x, wt, bias, stride, padding, dilation, False, [0, 0], 1)
    before = kernels64.calls["convolution"]
    _check(A.convolution.default, args, {}, kernels64.convolution(args, {}))
    assert kernels64.calls["convolution"] == before + 1


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("mask", [[False, True, True], [False, True, False], [False, False, True]])
def test_weight_and_bias_gradients_within_their_blocked_bound(case: Any, mask: list[bool]) -> None:
    """``weight_grad_blocks`` against ATen's float64 gradients: within ``γ_K'·S``, ``K'``
    from ``site_bounds`` (blocks of images, SPEC VI §1); small chunks split blocks too."""
    from dk.pol.backends import blocked

    n, c, h, w, co, kh, kw, stride, padding, dilation, _ = case
    g = torch.Generator().manual_seed(100 * CONV_CASES.index(case) + sum(mask) + 4 * mask[1])
    x = _rand(g, n, c, h, w)
    wt = _rand(g, co, c, kh, kw)
    out = A.convolution.default(x, wt, None, stride, padding, dilation, False, [0, 0], 1)
    go = _rand(g, *out.shape)
    if n > 1:  # a permuted-then-restored layout: go non-contiguous
        go = _rand(g, *out.shape[1:], n).permute(3, 0, 1, 2)
    args = (go, x, wt, [co], stride, padding, dilation, False, [0, 0], 1, mask)
    sp = max(int(go.shape[2]) * int(go.shape[3]), h * w)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernels64, "_CHUNK", 8 * c * kh * kw * sp)  # one image per chunk
        got = kernels64.weight_grad_blocks(args, blocked._per_block(sp))
    assert got is not None
    _check(A.convolution_backward.default, args, {}, (None, *got))


def test_convolution_cases_left_to_aten() -> None:
    g = torch.Generator().manual_seed(3)
    x, wt = _rand(g, 2, 4, 6, 6), _rand(g, 4, 2, 3, 3)
    s = ([1, 1], [1, 1], [1, 1])
    assert kernels64.convolution((x, wt, None, *s, False, [0, 0], 2), {}) is None  # groups
    w4 = _rand(g, 4, 4, 3, 3)
    assert kernels64.convolution((x, w4, None, *s, True, [0, 0], 1), {}) is None  # transposed
    cl = x.contiguous(memory_format=torch.channels_last)
    assert kernels64.convolution((cl, w4, None, *s, False, [0, 0], 1), {}) is None
    assert kernels64.convolution((x.float(), w4.float(), None, *s, False, [0, 0], 1), {}) is None
    with pytest.MonkeyPatch.context() as mp:  # below MIN_MACS: ATen is as fast
        mp.setattr(kernels64, "MIN_MACS", {"convolution": 2 * 4 * 36 * 36 + 1})
        assert kernels64.convolution((x, w4, None, *s, False, [0, 0], 1), {}) is None
    assert kernels64.convolution((x, w4, None, *s, False, [0, 0], 1), {}) is not None
    x1 = _rand(g, 2, 4, 6)  # 1-D convolution
    w1 = _rand(g, 4, 4, 3)
    assert kernels64.convolution((x1, w1, None, [1], [1], [1], False, [0], 1), {}) is None


def _mm_cases(g: torch.Generator) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    a, b = _rand(g, 7, 13), _rand(g, 13, 5)
    at = _rand(g, 13, 7).t()  # transposed views (a Linear's backward)
    bt = _rand(g, 5, 13).t()
    sl = _rand(g, 7, 26)[:, ::2]  # neither C- nor F-contiguous
    bias, full = _rand(g, 5), _rand(g, 7, 5)
    b1, b2 = _rand(g, 3, 4, 9), _rand(g, 3, 9, 6)
    b1t = _rand(g, 3, 9, 4).transpose(1, 2)
    nan = torch.full((7, 5), float("nan"), dtype=torch.float64)
    return [
        (A.mm.default, (a, b), {}),
        (A.mm.default, (at, bt), {}),
        (A.mm.default, (sl, b), {}),
        (A.mm.default, (_rand(g, 1, 300), _rand(g, 300, 1)), {}),
        (A.addmm.default, (bias, a, b), {}),
        (A.addmm.default, (full, at, b), {"beta": 0.5, "alpha": -2.0}),
        (A.addmm.default, (nan, a, bt), {"beta": 0}),
        (A.bmm.default, (b1, b2), {}),
        (A.bmm.default, (b1t, b2), {}),
        (A.baddbmm.default, (_rand(g, 3, 4, 6), b1, b2), {"beta": 1, "alpha": 0.125}),
        (A.baddbmm.default, (_rand(g, 6), b1t, b2), {}),
    ]


def test_matrix_products_within_the_bound_of_aten() -> None:
    g = torch.Generator().manual_seed(11)
    for func, args, kwargs in _mm_cases(g):
        name = func.overloadpacket.__name__
        before = kernels64.calls[name]
        _check(func, args, kwargs, kernels64.matmul(name, args, kwargs))
        assert kernels64.calls[name] == before + 1


def _same_state(built: list[Any]) -> None:
    """The two examples' models end in the same bits."""
    for (k, v), (k2, v2) in zip(
        built[0]["model"].state_dict().items(), built[1]["model"].state_dict().items(), strict=True
    ):
        assert k == k2 and torch.equal(v, v2), k


def _final(kind: str, record_fast: bool, replay_fast: bool) -> None:
    """Record one interval with fast kernels on (or off), replay with them off (or on)."""
    cfg = {"seed": 5, "width": 8 if kind == "resnet" else 32, "batch": 4}
    built = []
    for _ in range(2):
        b = ex.build(kind, **cfg)
        ex.train(b, range(1))  # plain float32 first step: the interval starts mid-run
        built.append(b)
    rec = RoundedMode.record(job_id=JOB, interval=1)
    rec.fast_kernels = record_fast
    n0 = sum(kernels64.calls.values())
    ex.train(built[0], range(1, 3), lambda: rec)
    log = rec.finish()
    n1 = sum(kernels64.calls.values())
    rep = RoundedMode.replay(log)
    rep.fast_kernels = replay_fast
    ex.train(built[1], range(1, 3), lambda: rep)
    rep.finish()  # the log is accepted: sites, trace and every entry
    n2 = sum(kernels64.calls.values())
    assert (n1 > n0) == record_fast and (n2 > n1) == replay_fast
    _same_state(built)


@pytest.mark.parametrize("kind", ["resnet", "lm"])
@pytest.mark.parametrize("fast", [(True, False), (False, True)])
def test_recorded_with_one_kernel_replays_with_the_other(kind: str, fast: Any) -> None:
    _final(kind, *fast)


def _one_step_calls(b: dict[str, Any]) -> Any:
    """``kernels64.calls`` of one recorded step of example ``b``."""
    before = kernels64.calls.copy()
    rec = RoundedMode.record(job_id=JOB, interval=0)
    ex.train(b, range(1), lambda: rec)
    rec.finish()
    return kernels64.calls - before


def test_the_fast_path_runs_in_training_and_switches_off() -> None:
    b = ex.build("resnet", seed=1, width=8, batch=4)
    ran = _one_step_calls(b)
    for name in ("convolution", "convolution_blocked", "weight_grad_blocks", "addmm", "mm"):
        assert ran[name] > 0, name
    before = kernels64.calls.copy()
    off = RoundedMode.record(job_id=JOB, interval=1)
    off.fast_kernels = False
    ex.train(b, range(1, 2), lambda: off)
    off.finish()
    assert kernels64.calls == before


def test_numpys_blas_follows_torchs_thread_count() -> None:
    """NumPy's OpenBLAS pool is set to torch's intra-op thread count before each kernel."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    g = torch.Generator().manual_seed(13)
    a, b = _rand(g, 4, 4), _rand(g, 4, 4)

    def blas_threads() -> set[int]:
        info = threadpoolctl.threadpool_info()
        numpys = [i for i in info if i["internal_api"] == "openblas" and "numpy" in i["filepath"]]
        return {i["num_threads"] for i in numpys}

    if not blas_threads():
        pytest.skip("NumPy without OpenBLAS")
    for n in (2, 1):
        torch.set_num_threads(n)
        assert kernels64.matmul("mm", (a, b), {}) is not None
        assert blas_threads() == {n}


@pytest.mark.parametrize(
    ("vendor", "mkl", "aten"),
    [
        ("GenuineIntel", True, True),
        ("AuthenticAMD", True, False),
        ("GenuineIntel", False, False),
        ("", True, False),
    ],
)
def test_products_go_to_aten_only_with_mkl_on_intel(vendor: str, mkl: bool, aten: bool) -> None:
    assert kernels64.aten_products(vendor, mkl) is aten


def test_the_cpu_vendor_is_read_from_cpuinfo(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``vendor_id`` of a cpuinfo file; without one (arm64, no file) ``platform.processor()``
    decides, which names Intel on Windows only."""
    import platform

    info = tmp_path / "cpuinfo"
    monkeypatch.setattr(platform, "processor", lambda: "")
    for vendor in ("GenuineIntel", "AuthenticAMD"):
        info.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: fpu\n")
        assert kernels64._cpu_vendor(str(info)) == vendor
    info.write_text("processor\t: 0\nCPU implementer\t: 0x41\n")  # arm64: no vendor_id
    assert kernels64._cpu_vendor(str(info)) == ""
    assert kernels64._cpu_vendor(str(tmp_path / "missing")) == ""
    monkeypatch.setattr(platform, "processor", lambda: "Intel64 Family 6, GenuineIntel")
    assert kernels64._cpu_vendor(str(tmp_path / "missing")) == "GenuineIntel"


def test_products_left_to_aten_keep_the_convolutions(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PRODUCTS = "aten"``: no matrix product through NumPy, convolutions still."""
    monkeypatch.setattr(kernels64, "PRODUCTS", "aten")
    ran = _one_step_calls(ex.build("resnet", seed=2, width=8, batch=4))
    assert ran["convolution"] > 0
    assert not any(ran[n] for n in ("mm", "addmm", "bmm", "baddbmm")), ran
    g = torch.Generator().manual_seed(3)
    a, w = _rand(g, 4, 5), _rand(g, 5, 3)
    assert kernels64.run(A.mm.default, (a, w), {}) is None
    monkeypatch.setattr(kernels64, "PRODUCTS", "numpy")
    assert kernels64.run(A.mm.default, (a, w), {}) is not None


def _products() -> int:
    return sum(kernels64.calls[n] for n in ("mm", "addmm", "bmm", "baddbmm"))


@pytest.mark.parametrize(("record", "replay"), [("numpy", "aten"), ("aten", "numpy")])
def test_a_run_recorded_with_one_products_kernel_replays_with_the_other(
    monkeypatch: pytest.MonkeyPatch, record: str, replay: str
) -> None:
    """Through ``PRODUCTS``: NumPy's products really ran on exactly one side, and both runs
    end in the same bits."""
    cfg = {"seed": 6, "width": 32, "batch": 4}
    built = [ex.build("lm", **cfg) for _ in range(2)]
    for b in built:
        ex.train(b, range(1))
    monkeypatch.setattr(kernels64, "PRODUCTS", record)
    rec = RoundedMode.record(job_id=JOB, interval=1)
    n0 = _products()
    ex.train(built[0], range(1, 3), lambda: rec)
    log = rec.finish()
    n1 = _products()
    monkeypatch.setattr(kernels64, "PRODUCTS", replay)
    rep = RoundedMode.replay(log)
    ex.train(built[1], range(1, 3), lambda: rep)
    rep.finish()
    n2 = _products()
    assert (n1 > n0, n2 > n1) == (record == "numpy", replay == "numpy")
    _same_state(built)


def test_norms_from_float32_are_atens_float64_norms() -> None:
    """``norms32``: the float64 norms of float32 tensors (within ``K·2^-53`` of ATen's on the
    float64 copies), and None for every case it does not take."""
    g = torch.Generator().manual_seed(17)
    ts = [torch.randn(300, 70, generator=g), torch.randn(5, generator=g) * 1e30, torch.zeros(0)]
    ts.append(torch.tensor([3.0, float("inf")]))
    got = kernels64.norms32(A._foreach_norm.Scalar, (ts,), {})
    ref = A._foreach_norm.Scalar([t.double() for t in ts])
    for t, o, r in zip(ts, got, ref, strict=True):
        assert o.dtype == torch.float64 and o.shape == r.shape == ()
        assert abs(float(o) - float(r)) <= t.numel() * 2.0**-53 * float(r) or float(o) == float(r)
    one = kernels64.norms32(A.linalg_vector_norm.default, (ts[0],), {"ord": 2})
    assert abs(float(one) - float(ref[0])) <= ts[0].numel() * 2.0**-53 * float(ref[0])
    w = ts[0]
    for func, args, kwargs in [
        (A._foreach_norm.Scalar, ([w, w.t()],), {}),  # strided
        (A._foreach_norm.Scalar, ([w],), {"ord": 1}),
        (A._foreach_norm.Scalar, ([w.double()],), {}),
        (A._foreach_norm.Scalar, ([w],), {"dtype": torch.float64}),
        (A.linalg_vector_norm.default, (w, 2, [0]), {}),
        (A.linalg_vector_norm.default, (w,), {"keepdim": True}),
        (A.linalg_vector_norm.default, (w, float("inf")), {}),
        (A.mm.default, (w, w.t()), {}),
    ]:
        assert kernels64.norms32(func, args, kwargs) is None, (func, kwargs)


def test_clipping_takes_the_float32_norms() -> None:
    b = ex.build("lm", seed=1, width=16, batch=2)  # clips its gradients' norm
    assert _one_step_calls(b)["_foreach_norm"] == 1


def test_sums_from_float32_within_the_bound_of_aten() -> None:
    """``sum32``: ATen's shape, and within ``γ_K·S`` of ATen's float64 sum, ``S`` the sums of
    absolute values; None for every case it does not take."""
    g = torch.Generator().manual_seed(19)
    x = torch.randn(6, 5, 7, generator=g) * torch.logspace(-20, 20, 7)
    cases = [([0], False), ([0, 1], True), ([2], True), ([-1], False), ([1, 2], False)]
    cases += [([0, 1, 2], False), ([], True), (None, False), ([-3, -2], False)]
    for dims, keep in cases:
        got = kernels64.sum32(A.sum.dim_IntList, (x, dims, keep), {})
        assert got is not None, dims
        out, s = got
        ref = A.sum.dim_IntList(x.double(), dims, keep)
        mags = A.sum.dim_IntList(x.double().abs(), dims, keep).reshape(-1).numpy()
        assert out.shape == ref.shape and out.dtype == torch.float64 and out.is_contiguous()
        k = x.numel() // max(out.numel(), 1)
        gamma = k * 2.0**-53 / (1 - k * 2.0**-53)
        assert (np.abs(out.reshape(-1).numpy() - ref.reshape(-1).numpy()) <= gamma * mags).all()
        assert (np.abs(s - mags) <= gamma * mags).all()
        # the S of the path without sum32 (the operation on absolute values, in float32):
        # the same dimensions, negative ones too
        aten_s = site_bounds(A.sum.dim_IntList, (x, dims, keep), {}, ref)[id(ref)].s()
        assert aten_s.shape == s.shape
        assert (np.abs(aten_s - s) <= 2 * k * 2.0**-24 * mags).all(), dims
    for args, kwargs in [
        ((x, [1]), {}),  # an inner dimension
        ((x, [0, 2]), {}),  # not one run
        ((x, [0, 0]), {}),  # repeated
        ((x, [3]), {}),  # out of range
        ((x, [0]), {"dtype": torch.float64}),
        ((x.transpose(0, 2), [0]), {}),
        ((x.double(), [0]), {}),
        ((torch.zeros(0, 3), [0]), {}),
        ((torch.zeros(2, 70000), [1]), {}),  # K > K_MAX: not a bounded site
    ]:
        assert kernels64.sum32(A.sum.dim_IntList, args, kwargs) is None, (args[1], kwargs)
    assert kernels64.sum32(A.sum.default, (x,), {}) is None


def test_training_takes_the_float32_sums() -> None:
    b = ex.build("lm", seed=1, width=16, batch=2)  # bias gradients: sums over the batch
    assert _one_step_calls(b)["sum"] > 0


def test_the_operation_on_absolute_values_keeps_dimensions_and_takes_scalars_whole() -> None:
    """``S`` (``AbsOp``): the absolute values of tensors and of Scalar arguments (α, β), never of
    dimensions: ``mean`` over dimension -1 is ``mean`` of ``|x|`` over -1, not over 1."""
    g = torch.Generator().manual_seed(23)
    x = torch.randn(3, 4, 5, generator=g)
    ref = A.mean.dim(x.double(), [-1])
    s = site_bounds(A.mean.dim, (x, [-1]), {}, ref)[id(ref)].s()
    assert np.allclose(s, x.abs().mean(-1).reshape(-1).numpy(), rtol=1e-6)
    a, b, c = (torch.randn(*sh, generator=g) for sh in ((4, 6), (6, 5), (5,)))
    out = A.addmm.default(c.double(), a.double(), b.double(), beta=-2, alpha=-3)
    s = site_bounds(A.addmm.default, (c, a, b), {"beta": -2, "alpha": -3}, out)[id(out)].s()
    want = 2 * c.abs() + 3 * (a.abs() @ b.abs())
    assert np.allclose(s, want.reshape(-1).numpy(), rtol=1e-6)
