"""The per-interval training loss (SPEC §11.7): value rules, the fold-sum mean, commitment,
and the verifier's checks (missing, forged, tolerant bound)."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.helpers import WORKER, make_bundle, tiny_job
from tests.unit.pol.test_transcript_ext import _manifest
from vectors.gen.forge import Forgery

from dk.crypto.canonical_json import canonical_json
from dk.errors import FormatError
from dk.pol import transcript as tr
from dk.pol.loss import (
    LossMeter,
    check_loss_value,
    interval_loss,
    loss_close,
    loss_required,
    loss_rtol,
    step_loss,
)


def _spec_interval_loss(steps: list[float]) -> float:
    """SPEC §11.7 and §1.4 re-implemented from the text, one binary64 addition at a time."""
    v = list(steps)
    n = len(v)
    while n > 1:
        h = n // 2
        for i in range(h):
            v[i] = v[i] + v[n - h + i]
        n -= h
    return v[0] / len(steps)


@pytest.mark.parametrize("value", [0, 0.0, 1, 2.5, 1e-300, 1e300])
def test_valid_values(value: Any) -> None:
    check_loss_value(value, "x")


@pytest.mark.parametrize("value", [-1e-9, -1, True, "1.0", None, [1.0], 2**53 + 1])
def test_invalid_values(value: Any) -> None:
    with pytest.raises(ValueError):
        check_loss_value(value, "x")


def test_interval_loss_is_the_fold_sum_mean() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 5, 8, 13, 100):
        steps = [float(x) for x in rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)]
        got = interval_loss(steps)
        assert struct.pack("<d", got) == struct.pack("<d", _spec_interval_loss(steps))
    # where the fold differs from a left-to-right sum: (1e16 + -1e16) + (1 + 1) is exact
    steps = [1e16, 1.0, -1e16, 1.0]
    assert interval_loss(steps) == _spec_interval_loss(steps) == 0.5
    assert sum(steps) / 4 == 0.25  # a naive sum would commit another number
    with pytest.raises(ValueError):
        interval_loss([])


def test_step_loss_adds_micro_batches_in_order() -> None:
    assert step_loss([1e16, 1.0, -1e16]) == 0.0
    assert step_loss([0.25]) == 0.25
    m = LossMeter()
    for v in (0.5, 0.25):
        m.add(v)
    m.end_step()
    m.add(1.0)
    m.end_step()
    assert m.pending() == 2
    assert m.take() == (0.75 + 1.0) / 2
    assert m.pending() == 0


def test_loss_key_is_registered_and_committed() -> None:
    m = _manifest()
    base = tr.transcript_root(m)
    m["intervals"][0]["ext"] = {"loss": 1.25}
    assert tr.transcript_root(m) != base
    m["transcript_root"] = tr.transcript_root(m).hex()
    parsed = tr.parse_manifest(canonical_json(m))
    assert parsed.interval_entries[0].ext == {"loss": 1.25}


@pytest.mark.parametrize("bad", [-0.5, "1", True, [1.0]])
def test_bad_loss_in_manifest_is_malformed(bad: Any) -> None:
    m = copy.deepcopy(_manifest())
    m["intervals"][1]["ext"] = {"loss": bad}
    m["transcript_root"] = tr.transcript_root(m).hex()
    with pytest.raises(FormatError) as e:
        tr.parse_manifest(canonical_json(m))
    assert e.value.reason == "MANIFEST_MALFORMED"


def test_which_jobs_require_it_and_the_tolerant_bound() -> None:
    exact, tol = tiny_job(), tiny_job(mode="tolerant")
    assert loss_required(exact) and loss_required(tol)
    assert loss_close(exact, 1.0, 1.0) and not loss_close(exact, 1.0, np.nextafter(1.0, 2.0))
    rho = loss_rtol(tol)
    assert rho == max(float(tol.pol["tolerance"]), 1e-4)
    assert loss_close(tol, 2.0 * (1 + 0.9 * rho), 2.0)
    assert not loss_close(tol, 2.0 * (1 + 1.1 * rho), 2.0)
    assert not loss_close(tol, 1.0, float("nan"))


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Path]]:
    out = {}
    for mode in ("exact", "tolerant"):
        tmp = tmp_path_factory.mktemp(mode)
        job = tiny_job(steps=10) if mode == "exact" else tiny_job(steps=10, mode="tolerant")
        out[mode] = make_bundle(tmp, job)
    return out


def _codes(bundle: Path, job: Any) -> list[str]:
    from dk.verifier import verify_bundle

    return verify_bundle(bundle, job, beacon=b"\x01" * 32, samples=100).codes


@pytest.mark.parametrize("mode", ["exact", "tolerant"])
def test_honest_bundle_commits_its_loss_and_verifies(
    bundles: dict[str, tuple[Any, Path]], mode: str
) -> None:
    from dk.pol.replay import make_replayer

    job, bundle = bundles[mode]
    m = json.loads((bundle / "manifest.json").read_text())
    losses = [iv["ext"]["loss"] for iv in m["intervals"]]
    assert all(0.0 < v < 10.0 for v in losses) and losses[-1] < losses[0]
    assert _codes(bundle, job) == []
    if mode == "exact":  # the committed loss is the replay's, bit for bit
        from dk.pol.checkpoint import parse_blob
        from dk.pol.data import load_dataset

        rp = make_replayer(job, load_dataset(job))
        start = parse_blob((bundle / m["checkpoints"][1]["blob"]).read_bytes())
        rp.run(start, 5, 10)
        assert interval_loss(rp.step_losses) == losses[1]


@pytest.mark.parametrize("mode", ["exact", "tolerant"])
@pytest.mark.parametrize(
    ("factor", "want"),
    [(0.5, "LOSS_MISMATCH"), (1.02, "LOSS_MISMATCH"), (None, "LOSS_MISSING")],
)
def test_forged_or_missing_loss_is_rejected(
    bundles: dict[str, tuple[Any, Path]],
    tmp_path: Path,
    mode: str,
    factor: float | None,
    want: str,
) -> None:
    from dk.verifier.replay import replay_interval

    job, bundle = bundles[mode]
    f = Forgery(bundle, tmp_path / "forged")
    if factor is None:
        del f.m["intervals"][1]["ext"]
    else:
        f.m["intervals"][1]["ext"]["loss"] *= factor
    forged = f.commit(WORKER)
    assert _codes(forged, job) == [want]
    r = replay_interval(forged, job, 1)
    assert (r.verdict, r.reason) == ("reject", want)
    assert replay_interval(forged, job, 0).ok


def test_tolerant_loss_within_the_bound_is_accepted(
    bundles: dict[str, tuple[Any, Path]], tmp_path: Path
) -> None:
    job, bundle = bundles["tolerant"]
    f = Forgery(bundle, tmp_path / "nudged")
    f.m["intervals"][1]["ext"]["loss"] *= 1 + 0.5 * loss_rtol(job)
    assert _codes(f.commit(WORKER), job) == []
    job_x, bundle_x = bundles["exact"]  # exact mode: one ulp is a mismatch
    f = Forgery(bundle_x, tmp_path / "ulp")
    iv = f.m["intervals"][0]["ext"]
    iv["loss"] = float(np.nextafter(iv["loss"], 10.0))
    assert _codes(f.commit(WORKER), job_x) == ["LOSS_MISMATCH"]


def test_zk_job_must_not_carry_a_loss(bundles: dict[str, tuple[Any, Path]]) -> None:
    from types import SimpleNamespace

    from dk.verifier.loss import check_loss_present
    from dk.verifier.verify import Stop

    _, bundle = bundles["exact"]
    man = tr.parse_manifest((bundle / "manifest.json").read_bytes())
    from dk.verifier.report import Report

    rep = Report()

    def fail(check: str, code: Any, msg: str, i: int | None = None) -> None:
        rep.fail(check, code, msg, i)
        raise Stop

    zk = SimpleNamespace(mode="zk", pol={}, train={})
    ctx = SimpleNamespace(job=zk, man=man, rep=rep, fail=fail)
    with pytest.raises(Stop):
        check_loss_present(ctx)  # type: ignore[arg-type]
    assert rep.codes == ["LOSS_MISMATCH"]
