"""Pinned EZKL settings: what calibration may not change."""

from __future__ import annotations

import pytest

from dk.circuits import CircuitError, ZkSettings
from dk.circuits.ezkl_backend import check_pinned


def _settings(**run_args: object) -> dict:
    ra = {
        "input_scale": 12,
        "param_scale": 12,
        "scale_rebase_multiplier": 1,
        "input_visibility": "Public",
        "output_visibility": "Public",
        "lookup_range": [-28672, 0],
        **run_args,
    }
    return {"run_args": ra, "model_input_scales": [12, 12], "model_output_scales": [12]}


def test_pinned_settings_pass() -> None:
    check_pinned(_settings(), ZkSettings(), softmax_floor=-28672)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"scale_rebase_multiplier": 10}, "scale_rebase_multiplier"),
        ({"input_scale": 7}, "input_scale"),
        ({"param_scale": 13}, "param_scale"),
        ({"output_visibility": "Private"}, "output_visibility"),
        ({"lookup_range": [-100, 0]}, "lookup range"),
    ],
)
def test_moved_pins_are_refused(change: dict, match: str) -> None:
    with pytest.raises(CircuitError, match=match):
        check_pinned(_settings(**change), ZkSettings(), softmax_floor=-28672)


def test_output_scale_drift_is_refused() -> None:
    s = _settings()
    s["model_output_scales"] = [24]
    with pytest.raises(CircuitError, match="scales"):
        check_pinned(s, ZkSettings())


def test_settings_validation() -> None:
    with pytest.raises(ValueError):
        ZkSettings(scale=2)
    with pytest.raises(ValueError):
        ZkSettings(visibility="private")
    assert ZkSettings().canonical()["scale_rebase_multiplier"] == 1
