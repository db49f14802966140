"""Bounded sites (SPEC VI §2): any summation order replays, where a fixed τ does not.

A matrix product's float64 value depends on the order its kernel sums in (another BLAS, a GPU);
the a-priori bound ``γ_K·S`` holds for every order. Following a log recorded with one order,
a verifier computing in another order — or at any value within the bound — rounds the same,
while the fixed threshold of the version-2 rule fails on the same values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from dk.errors import FormatError
from dk.pol.backends.bounds import C_RECORD, Bound, bound_cap
from dk.pol.backends.rounded import RoundedMode

JOB = bytes(range(32))
K = 4096


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _product() -> tuple[torch.Tensor, torch.Tensor, Bound]:
    g = torch.Generator().manual_seed(7)
    a = torch.randn(256, K, generator=g)
    b = torch.randn(K, 256, generator=g)
    v = a.double() @ b.double()
    # another order: 8 interleaved partial products, summed last to first
    parts = [a[:, i::8].double() @ b[i::8, :].double() for i in range(8)]
    other = parts[7]
    for p in reversed(parts[:7]):
        other = other + p
    return v, other, Bound.given(K, a.abs() @ b.abs())


def _follow(v: torch.Tensor, other: torch.Tensor, bound: Bound | None) -> tuple[Any, Any]:
    """Record on ``v``, replay on ``other``: (recorded float32, replayed float32 or error)."""
    rec = RoundedMode.record(job_id=JOB, interval=0)
    r = rec.round_site(v, "mm.default", bound)
    rep = RoundedMode.replay(rec.finish())
    try:
        o = rep.round_site(other, "mm.default", bound)
        rep.finish()
    except FormatError as e:
        return r, e.reason
    return r, o


def _moved(v: torch.Tensor, bound: Bound, toward: bool) -> torch.Tensor:
    """Each element moved by twice its bound, ``2·γ_K·S`` (the largest difference of two honest
    values), toward (or away from) its nearest float32 midpoint, where the element's threshold
    comes from the bound (SPEC VI §2: no assumption there); other elements stay."""
    vn = v.numpy().reshape(-1)
    r = vn.astype(np.float32)
    f = r.astype(np.float64)
    up = np.nextafter(r, np.float32(np.inf)).astype(np.float64)
    down = np.nextafter(r, np.float32(-np.inf)).astype(np.float64)
    mid = np.where(vn >= f, (f + up) / 2, (f + down) / 2)
    b = K * 2.0**-53 / (1 - K * 2.0**-53) * bound.s()
    beta = b / np.abs(up - f) * 2.0**29
    promised = C_RECORD * beta * 1.1 + 2 < bound_cap(1 << 19)
    step = np.sign(mid - vn) * 2 * b * (1 if toward else -1)
    return torch.from_numpy(np.where(promised, vn + step, vn).reshape(v.shape))


def test_another_summation_order_replays_under_the_bound() -> None:
    v, other, bound = _product()
    assert (v != other).any()  # the two orders differ at the bit level
    r, o = _follow(v, other, bound)
    assert isinstance(o, torch.Tensor) and torch.equal(r, o)


@pytest.mark.parametrize("toward", [True, False])
def test_any_honest_difference_replays_where_a_fixed_tau_fails(toward: bool) -> None:
    v, _, bound = _product()
    other = _moved(v, bound, toward)
    # toward: elements whose two values straddle a rounding boundary, which the log must settle
    assert not toward or (other.float() != v.float()).sum().item() > 0
    r, o = _follow(v, other, bound)
    assert isinstance(o, torch.Tensor) and torch.equal(r, o)
    if toward:  # the version-2 rule (every threshold the job's t) on the same values
        r, o = _follow(v, other, None)
        assert not isinstance(o, torch.Tensor) or not torch.equal(r, o)


def test_short_sums_log_less_than_the_fixed_tau() -> None:
    # a convolution-like product (144 terms): its bound is far below t = 2^-10 of a gap
    g = torch.Generator().manual_seed(8)
    a, b = torch.randn(2048, 144, generator=g), torch.randn(144, 256, generator=g)
    v, bound = a.double() @ b.double(), Bound.given(144, a.abs() @ b.abs())
    logs = []
    for bd in (bound, None):
        mode = RoundedMode.record(job_id=JOB, interval=0)
        mode.round_site(v, "mm.default", bd)
        logs.append(mode.finish())
    n_bounded, n_fixed = len(logs[0].entries), len(logs[1].entries)
    assert 0 < 10 * n_bounded < n_fixed
