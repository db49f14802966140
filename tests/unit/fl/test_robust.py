"""Robust aggregation rules: torch twins against the NumPy references; attacks (SPEC §VII.3)."""

from __future__ import annotations

import numpy as np
import pytest

from dk.fl import robust as ref
from dk.fl import robust_fast as fast
from dk.fl.aggregators import AGGREGATORS, make_aggregator
from dk.fl.attacks import MODEL_ATTACKS, alie_z
from dk.fl.simulate import SimConfig, run_digits


@pytest.fixture(params=[(7, 33, 1), (10, 50, 2), (12, 1, 3)])
def updates(request):
    n, d, seed = request.param
    return np.random.default_rng(seed).standard_normal((n, d))


def test_fedavg(updates):
    w = np.random.default_rng(0).uniform(0.5, 2.0, updates.shape[0])
    np.testing.assert_allclose(fast.fedavg_fast(updates), ref.fedavg_reference(updates))
    np.testing.assert_allclose(
        fast.fedavg_fast(updates, weights=w), ref.fedavg_reference(updates, weights=w)
    )


def test_median(updates):
    np.testing.assert_allclose(fast.median_fast(updates), ref.median_reference(updates))
    np.testing.assert_allclose(fast.median_fast(updates[:-1]), ref.median_reference(updates[:-1]))


@pytest.mark.parametrize("b", [0, 1, 2])
def test_trimmed_mean(updates, b):
    np.testing.assert_allclose(
        fast.trimmed_mean_fast(updates, b=b), ref.trimmed_mean_reference(updates, b=b)
    )


@pytest.mark.parametrize("m", [1, 3])
def test_krum(updates, m):
    np.testing.assert_allclose(
        fast.krum_scores_fast(updates, f=2), ref.krum_scores_reference(updates, f=2)
    )
    np.testing.assert_allclose(
        fast.krum_fast(updates, f=2, m=m), ref.krum_reference(updates, f=2, m=m)
    )


def test_fltrust(updates):
    root = np.random.default_rng(9).standard_normal(updates.shape[1])
    u = updates.copy()
    u[0] = 0.0  # a zero update gets no trust
    np.testing.assert_allclose(fast.fltrust_fast(u, root=root), ref.fltrust_reference(u, root=root))
    np.testing.assert_allclose(  # no positive trust at all: the zero update
        fast.fltrust_fast(-np.abs(u) * np.sign(root), root=root), 0.0
    )


def test_rules_resist_one_huge_update():
    rng = np.random.default_rng(4)
    u = rng.normal(1.0, 0.1, (9, 20))
    u[0] = 1e6
    for name in ("median", "trimmed_mean", "krum", "multikrum"):
        got = make_aggregator(name, f=1)(u)
        assert np.all(np.abs(got - 1.0) < 0.5), name
    assert np.all(make_aggregator("fedavg")(u) > 1e4)
    root = rng.normal(1.0, 0.1, 20)
    assert np.all(np.abs(make_aggregator("fltrust", f=1)(u, root=root) - 1.0) < 0.5)


@pytest.mark.parametrize("name", AGGREGATORS)
def test_registry_backends_agree(name, updates):
    root = np.ones(updates.shape[1])
    a = make_aggregator(name, f=2, backend="fast")(updates, root=root)
    b = make_aggregator(name, f=2, backend="reference")(updates, root=root)
    np.testing.assert_allclose(a, b)


def test_bad_parameters():
    with pytest.raises(ValueError, match="krum needs"):
        ref.krum_reference(np.zeros((4, 2)), f=2)
    with pytest.raises(ValueError, match="cannot trim"):
        fast.trimmed_mean_fast(np.zeros((4, 2)), b=2)
    with pytest.raises(ValueError, match="unknown aggregator"):
        make_aggregator("mean")


def test_attacks_touch_only_malicious_rows():
    rng = np.random.default_rng(5)
    u = rng.standard_normal((10, 8))
    for name, attack in MODEL_ATTACKS.items():
        out = attack(u, [0, 1], np.random.default_rng(0))
        np.testing.assert_array_equal(out[2:], u[2:])
        if name not in ("none", "label_flip", "lazy"):
            assert not np.allclose(out[:2], u[:2]), name
    assert alie_z(50, 24) == pytest.approx(1.7507, abs=1e-4)  # s = 26 - 24 = 2: Φ⁻¹(0.96)


@pytest.mark.slow
def test_robust_rule_survives_scaling_where_fedavg_fails():
    cfg = SimConfig(rounds=8, local_steps=5)
    clean = run_digits("fedavg", cfg=cfg)
    assert run_digits("fedavg", "scaling", cfg=cfg) < clean - 0.05
    assert run_digits("trimmed_mean", "scaling", cfg=cfg) > clean - 0.05
    gate = run_digits("fedavg", "lazy", cfg=cfg, pol_gate=lambda i: i >= cfg.f)
    assert gate > clean - 0.05
