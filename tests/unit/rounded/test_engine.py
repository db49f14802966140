"""The rounded dispatch mode in one process: honest replay, forgeries, coverage errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dk.errors import FormatError
from dk.pol.backends import examples as ex
from dk.pol.backends.log import (
    LOG_INVALID,
    LOG_MISMATCH,
    LOG_MISSING,
    TRACE_MISMATCH,
    RoundingLog,
    check_binding,
    decode_log,
)
from dk.pol.backends.rounded import (
    RoundedMode,
    UnsupportedOp,
    _check_missing,
    _neighbour,
    boundary_distance,
)
from dk.pol.checkpoint import checkpoint_root

JOB = bytes(range(32))
CFG = {"seed": 3, "width": 256, "batch": 32}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _record(steps: range, interval: int = 0) -> tuple[bytes, RoundingLog, RoundedMode]:
    b = ex.build("mlp", **CFG)
    ex.train(b, range(steps.start))
    mode = RoundedMode.record(job_id=JOB, interval=interval)
    ex.train(b, steps, lambda: mode)
    return checkpoint_root(ex.state_tensors(b["model"], b["opt"])), mode.finish(), mode


def _replay(log: RoundingLog, steps: range) -> bytes:
    b = ex.build("mlp", **CFG)
    ex.train(b, range(steps.start))
    mode = RoundedMode.replay(log)
    ex.train(b, steps, lambda: mode)
    mode.finish()
    return checkpoint_root(ex.state_tensors(b["model"], b["opt"]))


@pytest.fixture(scope="module")
def honest() -> tuple[bytes, RoundingLog, list[int]]:
    torch.set_num_threads(1)
    root, log, mode = _record(range(0, 2))
    assert len(log.entries) > 20  # the forgeries below need entries to work on
    return root, decode_log(log.encode()), mode.distances()


def _reason(log: RoundingLog) -> str:
    with pytest.raises(FormatError) as e:
        _replay(log, range(0, 2))
    return str(e.value.reason)


def test_honest_log_replays_to_committed_root(honest: Any) -> None:
    root, log, _ = honest
    assert _replay(log, range(0, 2)) == root


def test_tampered_direction_changes_the_root(honest: Any) -> None:
    root, log, _ = honest
    # the first site with entries (step 0's forward, which step 1 builds on), every direction
    # flipped: one ulp of the last step's gradient may vanish in the parameter update
    first = log.entries[0][0]
    entries = [(s, e, 1 - u if s == first else u) for s, e, u in log.entries]
    forged = RoundingLog(**{**vars(log), "entries": entries})
    assert _replay(forged, range(0, 2)) != root  # verifier: REPLAY_MISMATCH


def test_entry_far_from_boundary_rejected(honest: Any) -> None:
    _, log, _ = honest
    site, elem, _up = log.entries[0]
    taken = {e for s, e, _ in log.entries if s == site}
    other = next(e for e in range(elem + 1, elem + 10_000) if e not in taken)
    entries = sorted([*log.entries, (site, other, 1)])
    assert _reason(RoundingLog(**{**vars(log), "entries": entries})) == LOG_INVALID


def test_entry_beyond_the_tensor_rejected(honest: Any) -> None:
    _, log, _ = honest
    site = log.entries[-1][0]
    entries = [*log.entries, (site, 2**40, 0)]
    assert _reason(RoundingLog(**{**vars(log), "entries": entries})) == LOG_INVALID


def test_dropped_entry_rejected(honest: Any) -> None:
    _, log, dist = honest
    nearest = int(np.argmin(dist))  # an entry within τ/2 of its boundary
    entries = log.entries[:nearest] + log.entries[nearest + 1 :]
    assert _reason(RoundingLog(**{**vars(log), "entries": entries})) == LOG_MISSING


@pytest.mark.parametrize(
    ("need", "elems", "first"),
    [
        ([3], [], 3),
        ([0, 5, 9], [5], 0),
        ([5, 9], [5], 9),
        ([5], [1, 5, 7], None),
        ([1, 7], [1, 5, 7], None),
        ([1, 5, 8], [1, 5, 7], 8),
        ([0, 7], [1, 5, 7], 0),
        ([4, 6], [1, 5, 7], 4),
        ([9, 0, 0], [5], 9),  # any order, repeats: the first missing in need's own order
        ([5, 6, 5], [5], 6),
    ],
)
def test_missing_entries_are_found_wherever_they_fall(
    need: list[int], elems: list[int], first: int | None
) -> None:
    """Replay rule 2 against the log's sorted elements: before the first, between two, past
    the last, and a site without entries."""
    need_a, elems_a = np.array(need, dtype=np.int64), np.array(elems, dtype=np.int64)
    if first is None:
        _check_missing(0, need_a, elems_a, "float32")
        return
    with pytest.raises(FormatError, match=f"element {first} lies") as e:
        _check_missing(0, need_a, elems_a, "float32")
    assert e.value.reason == LOG_MISSING


def test_a_log_out_of_order_is_invalid(honest: Any) -> None:
    """The replay rules search each site's elements: a log built in memory with its entries
    out of order is refused, not searched wrongly (decode_log refuses it in bytes)."""
    _, log, _ = honest
    entries = [log.entries[1], log.entries[0], *log.entries[2:]]
    with pytest.raises(FormatError) as e:
        RoundedMode.replay(RoundingLog(**{**vars(log), "entries": entries}))
    assert e.value.reason == LOG_INVALID
    repeated = [log.entries[0], *log.entries]
    with pytest.raises(FormatError) as e:
        RoundedMode.replay(RoundingLog(**{**vars(log), "entries": repeated}))
    assert e.value.reason == LOG_INVALID


def test_an_entrys_value_is_the_neighbour_on_its_side() -> None:
    """``_neighbour`` against both neighbours taken apart, on values on either side of their
    rounding, exact float32 values, zeros, infinities, NaN, subnormals and the float32 limit."""
    rng = np.random.default_rng(11)
    v = rng.standard_normal(4096) * np.exp2(rng.integers(-160, 130, 4096))
    v[:12] = [0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-149, -(2.0**-150), 1.5 * 2.0**-149,
              3.4028234663852886e38, 3.4028235e38 * 1.0000001, 1.0, -1.0]  # fmt: skip
    with np.errstate(over="ignore"):
        r = v.astype(np.float32) + np.float32(0.0)
        for up in (np.zeros(v.size, bool), np.ones(v.size, bool), rng.random(v.size) < 0.5):
            above = r.astype(np.float64) > v
            to_up, to_down = (
                np.nextafter(r, np.float32(np.inf)),
                np.nextafter(r, np.float32(-np.inf)),
            )
            want = np.where(up, np.where(above, r, to_up), np.where(above, to_down, r))
            got = _neighbour(r, v, up)
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_log_of_another_interval_rejected(honest: Any) -> None:
    _, log0, _ = honest
    root1, log1, _ = _record(range(2, 4), interval=1)
    with pytest.raises(FormatError) as e:
        check_binding(log0, job_id=JOB, interval=1, tau_log2=log1.tau_log2)
    assert e.value.reason == LOG_MISMATCH
    # re-labelled as interval 1: its entries do not sit on interval 1's boundaries
    relabelled = RoundingLog(**{**vars(log0), "interval": 1})
    with pytest.raises(FormatError) as e:
        _replay(relabelled, range(2, 4))
    assert e.value.reason in (LOG_INVALID, LOG_MISSING)
    assert _replay(log1, range(2, 4)) == root1


def test_short_replay_is_a_trace_mismatch(honest: Any) -> None:
    _, log, _ = honest
    b = ex.build("mlp", **CFG)
    mode = RoundedMode.replay(log)
    ex.train(b, range(0, 1), lambda: mode)
    with pytest.raises(FormatError) as e:
        mode.finish()
    assert e.value.reason in (TRACE_MISMATCH, LOG_INVALID)


def test_uncovered_op_fails_at_record_time() -> None:
    x = torch.randn(8, 8)
    with pytest.raises(UnsupportedOp, match="cumprod"), RoundedMode.record(job_id=JOB, interval=0):
        torch.cumprod(x, 0)
    d = torch.randn(4, 4, dtype=torch.float64)
    with pytest.raises(UnsupportedOp, match="float64"), RoundedMode.record(job_id=JOB, interval=0):
        d @ d


def test_error_in_backward_is_kept_for_finish() -> None:
    class Odd(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return torch.cumprod(g, 0)

    x = torch.randn(4, requires_grad=True)
    mode = RoundedMode.record(job_id=JOB, interval=0)
    with pytest.raises(Exception), mode:  # noqa: B017 - autograd may wrap it
        Odd.apply(x).sum().backward()
    with pytest.raises(UnsupportedOp):
        mode.finish()


def test_fused_ops_are_split_into_single_roundings() -> None:
    g = torch.Generator().manual_seed(0)
    s, a, b = (torch.randn(1000, generator=g) for _ in range(3))
    with RoundedMode.record(job_id=JOB, interval=0) as mode:
        out = s.clone().addcmul_(a, b, value=0.3)
        lerp = torch.lerp(s, a, 0.1)
        add = torch.add(s, a, alpha=-0.05)
    assert mode.sites == 0  # no float64 site, hence no log
    v = torch.tensor(0.3, dtype=torch.float32)
    assert torch.equal(out, s + v * (a * b))
    assert torch.equal(lerp, s + torch.tensor(0.1) * (a - s))
    assert torch.equal(add, s + a * torch.tensor(-0.05))


def test_in_place_covered_op_writes_back() -> None:
    t = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    want = t.double().exp().float()
    with RoundedMode.record(job_id=JOB, interval=0) as mode:
        out = t.exp_()
    assert out is t and t.dtype == torch.float32 and torch.equal(t, want)
    assert mode.sites == 1


def test_batch_norm_runs_decomposed_with_running_stats_in_place() -> None:
    bn = torch.nn.BatchNorm1d(4)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    mode = RoundedMode.record(job_id=JOB, interval=0)
    mode.signatures = []
    with mode:
        bn(x)
    assert bn.running_mean.dtype == torch.float32
    # SPEC VI §1: the mean is a covered site (rounded once), the update float32 arithmetic
    want = x.double().mean(0).float() * 0.1
    assert torch.equal(bn.running_mean, want)
    assert mode.sites and all(
        shape != (16, 4) for _, shape in mode.signatures
    )  # no per-element site


def test_boundary_distance_subnormal_and_specials() -> None:
    tiny = 2.0**-149
    v = np.array([tiny * 0.5, tiny * 0.25, tiny * 3.5, 0.0, np.inf, np.nan, 3.0e38 * 10])
    d = boundary_distance(v)
    assert d[0] == 0 and d[1] == 2**27 and d[2] == 0
    assert (d[3:] == 2**28).all()


_UNIFORM = """
import sys, torch
from dk.pol.backends.rounded import RoundedMode
with RoundedMode.record(job_id=bytes(32), interval=0):
    torch.manual_seed(0)
    w = torch.empty(8, 3, 3, 3)
    torch.nn.init.kaiming_uniform_(w, a=5**0.5)
sys.stdout.write(w.numpy().tobytes().hex())
"""


def test_uniform_is_a_unit_fill_then_two_float32_operations() -> None:
    """SPEC VI §1 random class: uniform(a, b) = u ⊗ f32(b − a) ⊕ f32(a), the same on every CPU
    capability (torch's own kernel rounds differently under ATEN_CPU_CAPABILITY=default)."""
    import os
    import subprocess
    import sys

    src = str(Path(__file__).resolve().parents[3] / "src")
    outs = []
    for cap in ("default", "avx2"):
        env = {**os.environ, "ATEN_CPU_CAPABILITY": cap, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": src}  # fmt: skip
        proc = subprocess.run([sys.executable, "-c", _UNIFORM], env=env, capture_output=True,
                              text=True, timeout=300, check=True)  # fmt: skip
        outs.append(proc.stdout)
    assert outs[0] == outs[1]
    torch.manual_seed(0)
    u = torch.rand(8, 3, 3, 3)
    bound = float(torch.nn.init.calculate_gain("leaky_relu", 5**0.5)) * (3.0 / 27) ** 0.5
    want = torch.add(torch.mul(u, torch.tensor(2 * bound)), torch.tensor(-bound))
    assert outs[0] == want.numpy().tobytes().hex()


def test_job_tau_is_hashed_and_only_for_rounded_jobs() -> None:
    """SPEC §6.1 / VI §2: pol.rounding_tau_log2 is in a rounded job's normal form (default
    filled in, hashed into job_id), absent from other jobs, and dropped when a copy leaves the
    rounded backend."""
    from dk.errors import FormatError
    from dk.pol.backends.log import DEFAULT_TAU_LOG2
    from dk.pol.job import parse_job

    dims = "[model]\ninput_dim = 4\noutput_dim = 3\n"
    plain = parse_job(dims)
    default = parse_job(dims + "[pol]\nbackend = 'rounded'\n")
    twelve = parse_job(dims + "[pol]\nbackend = 'rounded'\nrounding_tau_log2 = 12\n")
    assert default.rounding_tau_log2 == DEFAULT_TAU_LOG2 and twelve.rounding_tau_log2 == 12
    assert default.job_id != twelve.job_id
    assert "rounding_tau_log2" not in plain.pol
    torch_copy = twelve.with_updates(pol={"backend": "torch"})
    assert "rounding_tau_log2" not in torch_copy.pol
    with pytest.raises(FormatError):
        parse_job(dims + "[pol]\nbackend = 'torch'\nrounding_tau_log2 = 12\n")


def test_dispatch_is_not_wrapped_for_dynamo() -> None:
    """Every ATen call reaches ``__torch_dispatch__`` directly: no ``torch._dynamo.disable``
    frames per call, and a rounded product in a fresh process imports no ``torch._dynamo``."""
    assert not hasattr(RoundedMode.__dict__["__torch_dispatch__"], "__wrapped__")
    code = (
        "import sys, torch\n"
        "from dk.pol.backends.rounded import RoundedMode\n"
        "m = RoundedMode.record(job_id=bytes(32), interval=0)\n"
        "with m:\n"
        "    y = torch.ones(3, 4) @ torch.ones(4, 2)\n"
        "assert m.finish().sites == 1\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False", out.stderr


def test_leaves_and_rebuilt_agree_with_pytree() -> None:
    """The dispatch path's own flatten opens what ``torch.utils._pytree`` opens in ATen calls
    (tuples, lists, dicts, named tuples, torch's structseqs) in the same order, and rebuilds the
    same structure around new leaves."""
    from collections import namedtuple

    from torch.utils._pytree import tree_flatten, tree_unflatten

    from dk.pol.backends.rounded import _leaves, _rebuilt

    pair = namedtuple("pair", "a b")
    t = [torch.full((2,), float(i)) for i in range(6)]
    maxed = torch.ones(2, 3).max(1)  # a structseq (values, indices)
    cases = [
        (t[0], t[1]),
        ((t[0], t[1], None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), {"alpha": 2}),
        ([t[0], [t[1], (t[2], {"x": t[3]})]], {"out": pair(t[4], t[5]), "dtype": torch.float32}),
        maxed,
        t[0],
        (),
    ]
    for x in cases:
        leaves, spec = tree_flatten(x)
        assert [id(v) for v in _leaves(x)] == [id(v) for v in leaves]
        new = [v * 2 if isinstance(v, torch.Tensor) else v for v in leaves]
        mine, theirs = _rebuilt(x, iter(new)), tree_unflatten(new, spec)
        assert type(mine) is type(theirs)
        assert tree_flatten(mine)[1] == spec
        assert [id(v) for v in tree_flatten(mine)[0]] == [id(v) for v in new]
