"""A simulated second machine: float64 results perturbed as another BLAS or GPU may.

Bounded sites (SPEC VI §2: matrix products, convolutions, sums) move anywhere within their
a-priori error bound ``γ_K·S`` (the worst any summation order may do); other sites far below τ/2.

Without the log, the two machines' float32 training diverges (some elements near a rounding
boundary flip); following the first machine's log, the second reaches the same root. This is
the mechanism's whole point, checked where one process can play both machines.
"""

from __future__ import annotations

import pytest
import torch

from dk.pol.backends import examples as ex
from dk.pol.backends.bounds import Bound
from dk.pol.backends.log import RoundingLog
from dk.pol.backends.rounded import RoundedMode
from dk.pol.checkpoint import checkpoint_root

CFG = {"seed": 5, "width": 256, "batch": 64}
REL = 2.0**-38  # 2^14 units of 2^-29 gap: 1/8 of t for k = 12, far below the t/2 margin


class _OtherMachine(RoundedMode):
    """Each float64 site result moved by ``u·γ_K·S`` (bounded) or ``u·2^-38·|v|`` (others),
    ``u ∈ {-1, 0, 1}`` seeded per site."""

    def round_site(
        self,
        v: torch.Tensor,
        name: str = "",
        bound: Bound | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.sites)
        u = torch.randint(-1, 2, v.shape, generator=g).to(torch.float64)
        if bound is None:
            return super().round_site(v * (1.0 + u * REL), name, bound, dtype)
        gamma = bound.k * 2.0**-53 / (1 - bound.k * 2.0**-53)
        s = torch.from_numpy(bound.s()).view(v.shape)
        return super().round_site(v + u * gamma * s, name, bound, dtype)


def _train(mode: RoundedMode) -> bytes:
    b = ex.build("mlp", **CFG)
    ex.train(b, range(3), lambda: mode)
    mode.finish()
    return checkpoint_root(ex.state_tensors(b["model"], b["opt"]))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_log_makes_the_other_machine_agree() -> None:
    first = RoundedMode.record(job_id=bytes(32), interval=0)
    root = _train(first)
    log: RoundingLog = first.finish()
    alone = _train(_OtherMachine(job_id=bytes(32), interval=0, tau_log2=12, log=None))
    assert alone != root  # without the log the machines disagree
    assert _train(_OtherMachine.replay(log)) == root  # following the log they agree
