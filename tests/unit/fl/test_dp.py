"""Replayable DP-SGD (SPEC Part VII §4): proves, verifies, catches other noise, reports ε."""

from __future__ import annotations

import pytest
from tests.helpers import WORKER

from dk.errors import FormatError
from dk.pol import default_job, train_job
from dk.prover import prove_run
from dk.verifier import verify_bundle

pytest.importorskip("opacus")

DP = {"noise_multiplier": 1.1, "max_grad_norm": 1.0, "delta": 1e-5}


def _job(**dp):
    return default_job(hidden=[8], steps=8, interval=4, batch_size=16, train={"dp": {**DP, **dp}})


def test_dp_job_proves_and_verifies(tmp_path):
    job = _job()
    assert job.pol["backend"] == "torch" and job.train["dp"]["accountant"] == "rdp"
    train_job(job, tmp_path / "run")
    bundle = prove_run(tmp_path / "run", job, WORKER, tmp_path / "bundle")
    rep = verify_bundle(bundle, job, beacon=bytes(32), samples=10)
    assert rep.ok, rep.to_dict()
    from dk.pol.dp import check_budget

    assert rep.figures["dp_epsilon"] == check_budget(job, 1797)
    assert rep.figures["dp_delta"] == 1e-5


def test_other_noise_is_rejected_on_replay(tmp_path, monkeypatch):
    import dk.pol.dp as dp

    job = _job()
    real = dp.noise_seed
    monkeypatch.setattr(dp, "noise_seed", lambda seed, step: real(seed + 1, step))
    train_job(job, tmp_path / "run")
    monkeypatch.setattr(dp, "noise_seed", real)
    bundle = prove_run(tmp_path / "run", job, WORKER, tmp_path / "bundle")
    rep = verify_bundle(bundle, job, beacon=bytes(32), samples=10)
    assert not rep.ok and set(rep.codes) == {"REPLAY_MISMATCH"}


def test_noise_differs_from_no_noise(tmp_path):
    a, b = _job(), _job(noise_multiplier=0.0)
    ra, rb = train_job(a, tmp_path / "a"), train_job(b, tmp_path / "b")
    assert ra.checkpoints[-1].root != rb.checkpoints[-1].root
    bundle = prove_run(tmp_path / "b", b, WORKER, tmp_path / "bundle")
    rep = verify_bundle(bundle, b, beacon=bytes(32), samples=1)
    assert rep.ok and rep.figures["dp_epsilon"] is None  # no noise: no finite ε


def test_epsilon_is_opacus_accountant(tmp_path):
    from opacus.accountants import RDPAccountant

    from dk.pol.dp import check_budget
    from dk.pol.recorder import Recorder

    job = _job()
    acc = RDPAccountant()
    for _ in range(job.steps):
        acc.step(noise_multiplier=1.1, sample_rate=16 / 1797)
    want = acc.get_epsilon(delta=1e-5)
    assert check_budget(job, 1797) == pytest.approx(want, rel=1e-9)
    assert Recorder(job, tmp_path / "run").dp_epsilon == pytest.approx(want, rel=1e-9)


def test_budget_over_target_is_refused_before_training(tmp_path):
    from dk.pol.dp import check_budget, noise_for_target

    job = _job(noise_multiplier=0.3, target_epsilon=1.0)
    with pytest.raises(FormatError, match=r"above train\.dp\.target_epsilon"):
        train_job(job, tmp_path / "run")
    assert not (tmp_path / "run" / "run.json").exists()
    sigma = noise_for_target(1.0, 1e-5, batch_size=16, n=1797, steps=8)
    assert check_budget(_job(noise_multiplier=sigma, target_epsilon=1.0), 1797) <= 1.0


@pytest.mark.parametrize(
    ("dp", "match"),
    [
        ({"max_grad_norm": 1.0, "delta": 1e-5}, "noise_for_target"),
        ({**DP, "clip": 1}, "not a DP setting"),
        ({**DP, "accountant": "gdp"}, "accountant"),
        ({**DP, "delta": 2.0}, "delta"),
    ],
)
def test_bad_dp_tables(dp, match):
    with pytest.raises(FormatError, match=match):
        default_job(hidden=[8], steps=8, interval=4, train={"dp": dp})
    with pytest.raises(FormatError, match="do not combine"):
        default_job(hidden=[8], steps=8, train={"dp": DP, "compression": "int8"})
