"""Matrix products' bounds without their ``S`` product (``bounds._ProductBound``, SPEC VI §2).

On the CPU a product's ``S`` is computed only where a Cauchy–Schwarz upper bound does not
already clear the element. The upper bound must cover ``S`` everywhere, the elements it lets
through must get ``S`` itself, and the log must be the one the whole ``S`` gives: recorded
either way and replayed the other way, bit for bit.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch

from dk.pol.backends import bounds
from dk.pol.backends import examples as ex
from dk.pol.backends.bounds import site_bounds
from dk.pol.backends.rounded import RoundedMode

JOB = bytes(range(32))
aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _operands(g: torch.Generator, *shape: int) -> torch.Tensor:
    """Random float32 values over several magnitudes, with zeros and a row of large ones."""
    x = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-8, 8, shape, generator=g))
    x[..., 0, :] *= 1e4
    return torch.where(torch.rand(*shape, generator=g) < 0.1, torch.zeros(()), x)


def _cases() -> list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(11)
    a, b = _operands(g, 37, 53), _operands(g, 61, 53).t()  # b transposed: a strided view
    c_row, c_full = _operands(g, 1, 61)[0], _operands(g, 37, 61)
    ba, bb = _operands(g, 3, 17, 29), _operands(g, 3, 29, 23)
    bc = _operands(g, 1, 17, 23)
    return [
        ("mm", aten.mm.default, (a, b), {}),
        ("addmm bias", aten.addmm.default, (c_row, a, b), {}),
        ("addmm scaled", aten.addmm.default, (c_full, a, b), {"beta": -0.5, "alpha": 3.0}),
        ("bmm", aten.bmm.default, (ba, bb), {}),
        ("baddbmm", aten.baddbmm.default, (bc, ba, bb), {"beta": 2.0, "alpha": -0.25}),
    ]


def _bound(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    out = func(*[t.double() for t in args], **kwargs)
    (bound,) = site_bounds(func, args, kwargs, out).values()
    return out, bound


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_upper_bound_covers_s_and_the_flagged_get_s_itself(case: Any) -> None:
    _, func, args, kwargs = case
    _, whole = _bound(func, args, kwargs)
    s = whole.s().astype(np.float64)  # the operation on absolute values (float32)
    _, bound = _bound(func, args, kwargs)
    assert bound.refine and type(bound).__name__ == "_ProductBound"
    k = int(args[-2].shape[-1])
    ub = bound.s_upper()
    assert ub.shape == s.shape and (ub >= s * (1 + k * 2.0**-24)).all()
    assert np.median(ub / np.maximum(s, 1e-30)) < 64  # an upper bound, not a useless one
    idx = np.sort(np.random.default_rng(3).choice(s.size, s.size // 10, replace=False))
    at = bound.s_at(idx)
    np.testing.assert_allclose(at, s[idx], rtol=k * 2.0**-22, atol=0)
    assert bound._s is None  # a tenth of the site: S only there, no product of the whole
    at_all = bound.s_at(np.arange(s.size))  # all of it: S of the whole site, once
    assert bound._s is not None
    np.testing.assert_array_equal(at_all, bound.s())


def _record(kind: str, product_bounds: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """One recorded step (after a warm-up step) of example ``kind``; its log and the calls
    whose whole ``S`` was computed."""
    computed: Counter[str] = Counter()
    get = bounds._AbsOp.get

    def counted(self: Any, index: int) -> np.ndarray:
        if self._out is None:
            computed[self.func.overloadpacket.__name__] += 1
        return get(self, index)

    with monkeypatch.context() as m:
        m.setattr(bounds._AbsOp, "get", counted)
        if not product_bounds:
            m.setattr(bounds, "_product_bound", lambda *a: None)
        built = ex.build(kind, seed=0, width=32, batch=4)
        ex.train(built, range(1), lambda: RoundedMode.record(job_id=JOB, interval=0))
        mode = RoundedMode.record(job_id=JOB, interval=1)
        ex.train(built, range(1, 2), lambda: mode)
        return mode.finish(), computed, built


@pytest.mark.parametrize("kind", ["lm", "resnet"])
def test_the_log_is_the_whole_s_log_and_replays_either_way(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, computed, built = _record(kind, True, monkeypatch)
    whole_log, whole_computed, whole_built = _record(kind, False, monkeypatch)
    products = {"mm", "addmm", "bmm", "baddbmm"}
    assert sum(whole_computed[p] for p in products) > 0  # the sites exist
    assert sum(computed[p] for p in products) == 0  # and needed no product on |A|, |B|
    assert log.encode() == whole_log.encode()
    for a, b in zip(built["model"].parameters(), whole_built["model"].parameters(), strict=True):
        assert torch.equal(a, b)
    # replayed by a verifier that takes the other way, the same step bit for bit
    for given, product_bounds in ((log, False), (whole_log, True)):
        with monkeypatch.context() as m:
            if not product_bounds:
                m.setattr(bounds, "_product_bound", lambda *a: None)
            b2 = ex.build(kind, seed=0, width=32, batch=4)
            ex.train(b2, range(1), lambda: RoundedMode.record(job_id=JOB, interval=0))
            rep = RoundedMode.replay(given)
            ex.train(b2, range(1, 2), lambda: rep)  # noqa: B023
            rep.finish()
        for a, b in zip(built["model"].parameters(), b2["model"].parameters(), strict=True):
            assert torch.equal(a, b)


def test_a_cancelling_product_flags_much_and_computes_s_once() -> None:
    """Sums that cancel to a small value have thresholds at the cap whatever the bound: a
    quarter of the elements are flagged, past an eighth S of the whole site is computed, and
    the entries are those of the whole S."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(64, 32, generator=g)
    a = torch.cat([a, -a], dim=1)  # every row sums pairs that cancel exactly ...
    b = torch.randn(32, 48, generator=g)
    up = torch.rand(32, 48, generator=g) < 0.5
    b = torch.cat([b, torch.where(up, torch.nextafter(b, torch.tensor(np.inf)), b)])  # ... nearly
    func = aten.mm.default
    v, bound = _bound(func, (a, b), {})
    _, whole = _bound(func, (a, b), {})
    whole.refine = False
    whole.s()
    logs = []
    for bd in (bound, whole):
        mode = RoundedMode.record(job_id=JOB, interval=0)
        mode.round_site(v.clone(), "mm.default", bd)
        logs.append(mode.finish())
    assert len(logs[0].entries) > v.numel() // 8  # thresholds at the cap
    assert bound._s is not None  # S of the whole site was computed, once
    assert logs[0].encode() == logs[1].encode()
