"""The one-pass elementwise kernels (``elementwise.py``) give the bits of ``split.py``'s torch
chains, on the cases they take, and leave every other case to the chains."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from dk.pol.backends import elementwise, split
from dk.pol.backends import examples as ex
from dk.pol.backends.rounded import RoundedMode
from dk.pol.checkpoint import checkpoint_root

pytestmark = pytest.mark.usefixtures("one_torch_thread")

aten = torch.ops.aten
JOB = bytes(range(32))
_SPECIAL = np.concatenate(
    [
        np.array(
            [0.0, -0.0, 1e-45, -1e-45, 1e-40, -3e-39, 3.4e38, -3.4e38, np.inf, -np.inf, 1.0],
            dtype=np.float32,
        ),
        # NaNs of both signs, with payloads, one signalling (where two meet, the result's sign
        # and payload are not fixed: compared as NaN, elementwise.py)
        np.array([0x7FC00000, 0xFFC00000, 0x7FC00123, 0xFFA00001], dtype=np.uint32).view(
            np.float32
        ),
    ]
)


def _rand(rng: np.random.Generator, n: int) -> torch.Tensor:
    """float32 over most of the exponent range, with special values sprinkled in."""
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-40, 40, n))).astype(np.float32)
    at = rng.integers(0, n, max(1, n // 50))
    x[at] = rng.choice(_SPECIAL, at.size)
    return torch.from_numpy(x)


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().numpy().view(np.int32).copy()


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    """The same bits wherever the result is a number; NaN exactly where the chain has NaN."""
    g, w = got.contiguous().numpy(), want.contiguous().numpy()
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    keep = ~np.isnan(w)
    np.testing.assert_array_equal(g.view(np.int32)[keep], w.view(np.int32)[keep])


SPLIT_CASES: list[tuple[Any, Callable[[np.random.Generator, int], tuple[Any, ...]], dict[str, Any]]]
SPLIT_CASES = [
    (aten.lerp.Scalar, lambda r, n: (_rand(r, n), _rand(r, n), 0.1), {}),
    (aten.lerp_.Scalar, lambda r, n: (_rand(r, n), _rand(r, n), 0.9), {}),
    (aten.addcmul.default, lambda r, n: (_rand(r, n), _rand(r, n), _rand(r, n)), {"value": 1e-3}),
    (aten.addcmul_.default, lambda r, n: (_rand(r, n), _rand(r, n), _rand(r, n)), {"value": 3}),
    (aten.addcdiv.default, lambda r, n: (_rand(r, n), _rand(r, n), _rand(r, n)), {"value": -0.37}),
    (aten.addcdiv_.default, lambda r, n: (_rand(r, n), _rand(r, n), _rand(r, n)), {}),
    (aten.add.Tensor, lambda r, n: (_rand(r, n), _rand(r, n)), {"alpha": -0.3}),
    (aten.add_.Tensor, lambda r, n: (_rand(r, n), _rand(r, n)), {"alpha": 1e-4}),
    (aten.sub.Tensor, lambda r, n: (_rand(r, n), _rand(r, n)), {"alpha": 1.7}),
    (aten.sub_.Tensor, lambda r, n: (_rand(r, n), _rand(r, n)), {"alpha": 2}),
]
ROUNDED_CASES: list[tuple[Any, Callable[[np.random.Generator, int], tuple[Any, ...]]]] = [
    (aten.div.Tensor, lambda r, n: (_rand(r, n), _rand(r, n))),
    (aten.div.Tensor, lambda r, n: (_rand(r, n), 0.123)),
    (aten.div.Tensor, lambda r, n: (_rand(r, n), 7)),
    (aten.div_.Tensor, lambda r, n: (_rand(r, n), 1e-30)),
    (aten.sqrt.default, lambda r, n: (_rand(r, n),)),  # negatives: torch's positive NaN
    (aten.sqrt_.default, lambda r, n: (_rand(r, n).abs(),)),
    (aten.reciprocal.default, lambda r, n: (_rand(r, n),)),
]


def _compare(run: Any, func: Any, make: Any, kwargs: dict[str, Any], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n in (1, 7, 33, 1000, 4099):
        args = make(rng, n)
        copies = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        before = sum(elementwise.calls.values())
        fast = run(func, args, kwargs)
        assert sum(elementwise.calls.values()) == before + 1, "the one-pass kernel did not run"
        with elementwise.off():
            slow = run(func, copies, kwargs)
        if func.overloadpacket.__name__.endswith("_"):  # in place: the caller's own tensor
            assert fast is args[0] and slow is copies[0]
        _same(fast, slow)


@pytest.mark.parametrize("case", range(len(SPLIT_CASES)))
def test_split_kernels_give_the_chains_bits(case: int) -> None:
    func, make, kwargs = SPLIT_CASES[case]
    _compare(split.run_split, func, make, kwargs, seed=100 + case)


@pytest.mark.parametrize("case", range(len(ROUNDED_CASES)))
def test_rounded_kernels_give_the_chains_bits(case: int) -> None:
    func, make = ROUNDED_CASES[case]
    _compare(split.run_rounded64, func, make, {}, seed=200 + case)


def test_foreach_lists_that_alias_each_other() -> None:
    """``_foreach_`` forms compute every result before writing any: with lists that alias each
    other, the in-place form gives the out-of-place form's results on the old values (an element
    written at once would feed the next), with the one-pass kernels and without."""
    rng = np.random.default_rng(8)
    cases = (
        (aten._foreach_add_.List, aten._foreach_add.List, (), {"alpha": 2.0}),
        (aten._foreach_lerp_.Scalar, aten._foreach_lerp.Scalar, (0.3,), {}),
        (aten._foreach_div_.List, aten._foreach_div.List, (), {}),
    )
    for inplace, outofplace, extra, kwargs in cases:
        run = split.run_rounded64 if "div" in str(inplace) else split.run_split
        for fast in (True, False):
            a, b = _rand(rng, 50), _rand(rng, 50)
            want = run(outofplace, ([a.clone(), b.clone()], [b.clone(), a.clone()], *extra), kwargs)
            with contextlib.nullcontext() if fast else elementwise.off():
                run(inplace, ([a, b], [b, a], *extra), kwargs)
            _same(a, want[0])
            _same(b, want[1])


def test_a_scalar_beyond_float32_is_inf_without_a_warning() -> None:
    rng = np.random.default_rng(9)
    a, b = _rand(rng, 40), _rand(rng, 40)
    with np.errstate(over="raise"):
        got = split.run_split(aten.add.Tensor, (a, b), {"alpha": 1e300})
    with elementwise.off():
        want = split.run_split(aten.add.Tensor, (a, b), {"alpha": 1e300})
    _same(got, want)


def test_foreach_forms_take_each_element() -> None:
    rng = np.random.default_rng(7)
    selfs = [_rand(rng, n) for n in (5, 300)]
    ends = [_rand(rng, n) for n in (5, 300)]
    keep = [t.clone() for t in selfs]
    before = elementwise.calls["lerp"]
    assert split.run_split(aten._foreach_lerp_.Scalar, (selfs, ends, 0.25), {}) is None
    assert elementwise.calls["lerp"] == before + 2
    with elementwise.off():
        split.run_split(aten._foreach_lerp_.Scalar, (keep, ends, 0.25), {})
    for a, b in zip(selfs, keep, strict=True):
        _same(a, b)
    # _foreach_addcdiv.ScalarList: one value per element
    t1, t2 = [_rand(rng, 300) for _ in range(2)], [_rand(rng, 300) for _ in range(2)]
    base = [_rand(rng, 300) for _ in range(2)]
    before = elementwise.calls["addcdiv"]
    got = split.run_split(aten._foreach_addcdiv.ScalarList, (base, t1, t2, [0.5, -3.0]), {})
    assert elementwise.calls["addcdiv"] == before + 2
    with elementwise.off():
        want = split.run_split(aten._foreach_addcdiv.ScalarList, (base, t1, t2, [0.5, -3.0]), {})
    for a, b in zip(got, want, strict=True):
        _same(a, b)
    before = elementwise.calls["sqrt"]
    roots = split.run_rounded64(aten._foreach_sqrt.default, ([t.abs() for t in ends],), {})
    assert elementwise.calls["sqrt"] == before + 2
    for r, t in zip(roots, ends, strict=True):
        _same(r, t.abs().double().sqrt().float())


def _not_taken() -> list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]]:
    rng = np.random.default_rng(11)
    a, b = _rand(rng, 64), _rand(rng, 64)
    square = _rand(rng, 64).reshape(8, 8)
    overlap = torch.zeros(65)
    overlap[:] = _rand(rng, 65)
    buf = _rand(rng, 65).numpy()  # two storages over one buffer
    return [
        ("strided", aten.add.Tensor, (square.t(), square), {"alpha": 0.5}),
        ("broadcast", aten.addcmul.default, (a, b, torch.ones(1)), {"value": 0.5}),
        ("float64", aten.lerp.Scalar, (a.double(), b.double(), 0.3), {}),
        ("tensor weight", aten.lerp.Scalar, (a, b, torch.tensor(0.3)), {}),
        ("bool alpha", aten.add.Tensor, (a, b), {"alpha": True}),
        ("scalar other", aten.add.Tensor, (a, 2.0), {"alpha": 0.5}),
        ("overlap", aten.add_.Tensor, (overlap[1:], overlap[:-1]), {"alpha": 0.5}),
        ("tensor divisor 0-d", aten.div.Tensor, (a, torch.tensor(3.0)), {}),
        ("bfloat16", aten.sqrt.default, (a.abs().bfloat16(),), {}),
        ("two storages", aten.add_.Tensor, _views(buf), {"alpha": 2.0}),
    ]


def _views(buf: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x[1:], x[:-1])`` of one NumPy buffer as two tensors of two storages."""
    return torch.from_numpy(buf[1:]), torch.from_numpy(buf[:-1])


@pytest.mark.parametrize("case", range(10))
def test_other_cases_run_the_chains(case: int) -> None:
    """Strided, broadcast, other dtypes, tensor or bool scalars and an in-place operand that
    overlaps its target elsewhere go to the torch chains, with their results."""
    label, func, args, kwargs = _not_taken()[case]
    rounded = func.overloadpacket.__name__ in ("div", "sqrt")
    run = split.run_rounded64 if rounded else split.run_split
    copies = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    if label == "overlap":  # the same overlap on a fresh buffer
        buf = args[0]._base.clone()  # type: ignore[union-attr]
        copies = (buf[1:], buf[:-1])
    if label == "two storages":  # the same buffer again: its first element, then the rest
        copies = _views(np.concatenate([args[1].numpy()[:1], args[0].numpy()]))
    before = elementwise.calls.copy()
    got = run(func, args, kwargs)
    assert elementwise.calls == before, label
    with elementwise.off():
        want = run(func, copies, kwargs)
    # (an overlap: the chain computes the whole product first, each element from the old
    # neighbour; written in one pass, an element would see its updated neighbour)
    _same(got.float(), want.float())


def _trained(kind: str, fast: bool) -> tuple[bytes, bytes]:
    b = ex.build(kind, seed=4, width=32 if kind == "lm" else 8, batch=4)
    ex.train(b, range(1))
    mode = RoundedMode.record(job_id=JOB, interval=1)
    before = sum(elementwise.calls.values())
    if fast:
        ex.train(b, range(1, 3), lambda: mode)
    else:
        with elementwise.off():
            ex.train(b, range(1, 3), lambda: mode)
    assert (sum(elementwise.calls.values()) > before) == fast
    return checkpoint_root(ex.state_tensors(b["model"], b["opt"])), mode.finish().encode()


@pytest.mark.parametrize("kind", ["lm", "resnet"])
def test_training_with_the_kernels_gives_the_chains_state_and_log(kind: str) -> None:
    """AdamW (lm) and SGD with momentum (resnet) under the rounded mode: the same checkpoint
    and the same log with the one-pass kernels as with the chains."""
    assert _trained(kind, True) == _trained(kind, False)


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_foreach_optimizers_record_and_replay(opt: str) -> None:
    """``foreach=True`` optimizers (torch's default on CUDA): ``_foreach_lerp_``,
    ``_foreach_addcmul_``, ``_foreach_addcdiv_``, ``_foreach_add_`` with ``alpha`` run under the
    mode, and a replay from the log reaches the recorded state; the same steps with
    ``foreach=False`` give the same bits."""

    def run(foreach: bool, log: Any = None) -> tuple[list[torch.Tensor], Any]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(12, 16), torch.nn.GELU(), torch.nn.Linear(16, 3)
        )
        if opt == "adamw":
            o: torch.optim.Optimizer = torch.optim.AdamW(
                model.parameters(), lr=1e-2, weight_decay=0.1, foreach=foreach
            )
        else:
            o = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=foreach)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(20, 12, generator=g), torch.randint(0, 3, (20,), generator=g)
        mode = (
            RoundedMode.record(job_id=JOB, interval=0) if log is None else RoundedMode.replay(log)
        )
        with mode:
            for _ in range(3):
                o.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                o.step()
        return [p.detach().clone() for p in model.parameters()], mode.finish()

    before = elementwise.calls.copy()
    state, log = run(True)
    assert sum((elementwise.calls - before).values()) > 0
    replayed, _ = run(True, log)
    plain_loop, _ = run(False)
    for a, b, c in zip(state, replayed, plain_loop, strict=True):
        np.testing.assert_array_equal(_bits(a), _bits(b))
        np.testing.assert_array_equal(_bits(a), _bits(c))
